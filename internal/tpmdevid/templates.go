package tpmdevid

import (
	"crypto/sha256"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
)

// The key templates, written here rather than taken from go-tpm-tools
// (which SPIRE uses) to keep the product's dependencies small; each says
// which of SPIRE v1.13.3's templates it must equal, since spire-agent's
// tpm_devid regenerates the same keys (pkg/agent/plugin/nodeattestor/
// tpmdevid/tpmutil in SPIRE's module).

// ekCertIndexRSA is the NV index of the RSA EK's certificate (TCG TPM v2.0
// Provisioning Guidance, section 7.8), the one spire-agent's tpm_devid
// reads.
const ekCertIndexRSA = tpmutil.Handle(0x01c00002)

// rsaSymmetric is the storage keys' symmetric scheme (AES-128-CFB). The
// EK's decides the credential's encryption in credential activation, so
// symBlockSize in Challenge is its key size in bytes.
var rsaSymmetric = tpm2.SymScheme{Alg: tpm2.AlgAES, KeyBits: 128, Mode: tpm2.AlgCFB}

// srkTemplateHighRSA is the TCG's high-range RSA storage root key template
// (H-1 in the EK Credential Profile 2.3): go-tpm-tools' SRKTemplateRSA with
// an empty unique field, which is SPIRE's tpmutil.SRKTemplateHighRSA. The
// DevID and the AK are children of the SRK this template makes, so
// spire-agent, which recreates the SRK from it, can load the DevID blobs:
// another template makes another parent, and the load fails.
func srkTemplateHighRSA() tpm2.Public {
	sym := rsaSymmetric
	return tpm2.Public{
		Type:    tpm2.AlgRSA,
		NameAlg: tpm2.AlgSHA256,
		// FlagNoDA is go-tpm-tools' (it follows Windows); it is part of
		// the template, so it changes the SRK if left out.
		Attributes: tpm2.FlagStorageDefault | tpm2.FlagNoDA,
		RSAParameters: &tpm2.RSAParams{
			Symmetric:  &sym,
			KeyBits:    2048,
			ModulusRaw: []byte{},
		},
	}
}

// ekTemplateRSA is the default RSA EK template (TCG EK Credential Profile
// 2.0, section 2.1.5.1), go-tpm-tools' DefaultEKTemplateRSA: the TPM
// regenerates from it the EK whose certificate is at ekCertIndexRSA.
func ekTemplateRSA() tpm2.Public {
	sym := rsaSymmetric
	return tpm2.Public{
		Type:    tpm2.AlgRSA,
		NameAlg: tpm2.AlgSHA256,
		// A storage key used only under a policy session, never by
		// password.
		Attributes: (tpm2.FlagStorageDefault | tpm2.FlagAdminWithPolicy) &^ tpm2.FlagUserWithAuth,
		AuthPolicy: ekAuthPolicy(),
		RSAParameters: &tpm2.RSAParams{
			Symmetric:  &sym,
			KeyBits:    2048,
			ModulusRaw: make([]byte, 256),
		},
	}
}

// ekAuthPolicy is the EK's policy digest: PolicySecret(TPM_RH_ENDORSEMENT)
// with an empty policyRef, extended from the all-zero digest.
func ekAuthPolicy() []byte {
	cmd, err := tpmutil.Pack(tpm2.CmdPolicySecret, tpm2.HandleEndorsement)
	if err != nil {
		panic(err) // packing two integers cannot fail
	}
	first := sha256.Sum256(append(make([]byte, sha256.Size), cmd...))
	second := sha256.Sum256(first[:])
	return second[:]
}

// akTemplateRSA is the attestation key's template, go-tpm-tools'
// AKTemplateRSA, which SPIRE's agent creates its AK from: a restricted
// RSA signing key (it signs only what the TPM itself produced, such as a
// TPMS_ATTEST) using RSASSA-PKCS1-v1_5 with SHA-256, the scheme SPIRE's
// server verifies certifications with.
func akTemplateRSA() tpm2.Public {
	return tpm2.Public{
		Type:       tpm2.AlgRSA,
		NameAlg:    tpm2.AlgSHA256,
		Attributes: tpm2.FlagSignerDefault,
		RSAParameters: &tpm2.RSAParams{
			Sign:    &tpm2.SigScheme{Alg: tpm2.AlgRSASSA, Hash: tpm2.AlgSHA256},
			KeyBits: 2048,
		},
	}
}

// devIDAttributes are the DevID key's: created in and bound to this TPM
// (fixedTPM, fixedParent, sensitiveDataOrigin), used with its (empty)
// password, which is what spire-agent's devid_password defaults to, and an
// unrestricted signing key, since spire-agent signs the server's nonce,
// which the TPM did not produce, with it.
const devIDAttributes = tpm2.FlagFixedTPM | tpm2.FlagFixedParent | tpm2.FlagSensitiveDataOrigin |
	tpm2.FlagUserWithAuth | tpm2.FlagSign

// devIDTemplateRSA is the DevID key's template: RSA 2048 with
// RSASSA-PKCS1-v1_5 and SHA-256, the signature spire-server's tpm_devid
// checks the nonce with for an RSA DevID certificate (x509.SHA256WithRSA);
// spire-agent hashes with the key's scheme hash, which must not be null.
func devIDTemplateRSA() tpm2.Public {
	return tpm2.Public{
		Type:       tpm2.AlgRSA,
		NameAlg:    tpm2.AlgSHA256,
		Attributes: devIDAttributes,
		RSAParameters: &tpm2.RSAParams{
			Sign:    &tpm2.SigScheme{Alg: tpm2.AlgRSASSA, Hash: tpm2.AlgSHA256},
			KeyBits: 2048,
		},
	}
}
