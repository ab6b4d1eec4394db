// Package tpmdevid provisions a VM's TPM DevID for SPIRE's built-in
// tpm_devid node attestor (docs/identity.md, "TPM"). The guest side creates
// an attestation key (AK) and a DevID signing key inside the VM's TPM and
// has the AK certify the DevID; the operator side checks the endorsement
// key's (EK) certificate against the platform's EK CA and the
// certification, challenges the guest by credential activation (only the
// TPM holding that EK can answer), and then signs a DevID certificate from
// the DevID CA that spire-server trusts. The DevID's private blob is
// encrypted by the TPM's storage key: a copy is useless outside that TPM.
package tpmdevid

// Enrollment is what the guest sends the operator. Every field but the EK
// certificate is in the TPM's wire format, as the TPM returned it.
type Enrollment struct {
	// EKCertificate is the DER EK certificate read from the TPM's NV index
	// 0x01c00002 (the RSA EK's, the one spire-agent's tpm_devid reads).
	EKCertificate []byte `json:"ekCertificate"`
	// AKPublic is the AK's TPMT_PUBLIC.
	AKPublic []byte `json:"akPublic"`
	// DevIDPublic is the DevID key's TPMT_PUBLIC.
	DevIDPublic []byte `json:"devidPublic"`
	// CertifyInfo is the TPMS_ATTEST of TPM2_Certify(DevID, signed by AK).
	CertifyInfo []byte `json:"certifyInfo"`
	// CertifySignature is the AK's TPMT_SIGNATURE over CertifyInfo.
	CertifySignature []byte `json:"certifySignature"`
}

// Challenge is a credential activation challenge (TPM2_MakeCredential's
// output, made by the operator for the AK's name under the EK): only the
// TPM holding both keys recovers its secret.
type Challenge struct {
	// Credential is the TPM2B_ID_OBJECT's contents.
	Credential []byte `json:"credential"`
	// Secret is the TPM2B_ENCRYPTED_SECRET's contents.
	Secret []byte `json:"secret"`
}
