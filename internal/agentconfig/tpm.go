package agentconfig

import "github.com/hyperfleet/hyperfleet/internal/tpmdevid"

// The TPM enrollment endpoints, served beside the credential broker on
// the agent server's listener: their URLs are the broker URL's with this
// path (docs/identity.md, "TPM").
const (
	// TPMEnrollPath answers a TPMEnrollRequest with a TPMChallenge.
	TPMEnrollPath = "/tpm/v1/enroll"
	// TPMActivatePath answers a TPMActivateRequest with the DevID
	// certificate.
	TPMActivatePath = "/tpm/v1/activate"
	// EnrollmentProofHeader carries GuestSecrets.EnrollmentProof on both.
	EnrollmentProofHeader = "Hyperfleet-Enrollment-Proof"
)

// TPMEnrollRequest starts a VM's DevID enrollment.
type TPMEnrollRequest struct {
	// SPIFFEID is the VM's expected SPIFFE ID (the agent config's
	// spiffe.spiffeID): it names the claim.
	SPIFFEID string `json:"spiffeID"`
	// Enrollment is what the VM's TPM made.
	Enrollment tpmdevid.Enrollment `json:"enrollment"`
}

// TPMChallenge is the answer to a TPMEnrollRequest.
type TPMChallenge struct {
	Challenge tpmdevid.Challenge `json:"challenge"`
}

// TPMActivateRequest answers the challenge. The enrollment is sent again:
// the operator keeps no state between the two calls (any replica may
// answer either), it derives the challenge's secret again from it.
type TPMActivateRequest struct {
	SPIFFEID   string              `json:"spiffeID"`
	Enrollment tpmdevid.Enrollment `json:"enrollment"`
	// Answer is the secret the TPM recovered (TPM2_ActivateCredential).
	Answer []byte `json:"answer"`
}

// TPMActivateResponse carries the VM's DevID certificate.
type TPMActivateResponse struct {
	// DevIDCertificate is the DER certificate of the DevID key.
	DevIDCertificate []byte `json:"devidCertificate"`
	// CACertificates are the DER certificates of the DevID CA that signed
	// it (for the record; spire-server has its own copy).
	CACertificates [][]byte `json:"caCertificates,omitempty"`
}
