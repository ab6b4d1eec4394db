package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SPIREConfig is how the VMs of a HypervisorCluster get SPIFFE identities
// from a SPIRE server (docs/identity.md). It belongs to the platform team,
// like the cluster itself: tenants choose only a template's
// spec.attestation.method, never the server, the trust domain or the
// operator's access to the server.
// +kubebuilder:validation:XValidation:rule="!has(self.joinTokenTTL) || !has(self.joinTokenTTL.min) || !has(self.joinTokenTTL.max) || duration(self.joinTokenTTL.min) <= duration(self.joinTokenTTL.max)",message="spire.joinTokenTTL.min must not be longer than spire.joinTokenTTL.max"
type SPIREConfig struct {
	// trustDomain is the SPIRE server's trust domain, such as
	// example.org. Every VM of this cluster gets the SPIFFE ID
	// spiffe://<trustDomain>/vm/<namespace>/<claim>/<claim uid>.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[a-z0-9._-]+$`
	TrustDomain string `json:"trustDomain"`

	// serverAddress is the SPIRE server's address as the VMs reach it,
	// host:port (the server's bind port, 8081 by default). It is rendered
	// into each VM's cloud-init for its spire-agent.
	// +required
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=261
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9.-]+:[0-9]{1,5}$|^\[[0-9A-Fa-f:.]+\]:[0-9]{1,5}$`
	ServerAddress string `json:"serverAddress"`

	// serverAPI is how the operator reaches the SPIRE Server API to create
	// join tokens and registration entries and to delete them again.
	// +required
	ServerAPI SPIREServerAPI `json:"serverAPI"`

	// joinTokenTTL bounds the join-token lifetimes templates may ask for
	// (spec.attestation.joinToken.ttl). A template outside the bounds is
	// not Ready (JoinTokenTTLNotAllowed).
	// +optional
	JoinTokenTTL *DurationBounds `json:"joinTokenTTL,omitempty"`

	// attestationDeadline is how long a VM's spire-agent has to attest,
	// counted from when the VM is up. A used or expired join token makes
	// spire-agent retry instead of failing, so without this deadline such a
	// VM would wait forever: a claim whose agent has not attested by then
	// fails with AttestationFailed and its VM is destroyed.
	// +optional
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('10s') && duration(self) <= duration('2h')",message="spire.attestationDeadline must be between 10s and 2h"
	AttestationDeadline *metav1.Duration `json:"attestationDeadline,omitempty"`

	// svidTTL is the lifetime of the X509-SVIDs issued to the VMs' agents.
	// An SVID is used once, to fetch the runner credential, so it can be
	// short; SPIRE's default_x509_svid_ttl applies when unset.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('24h')",message="spire.svidTTL must be between 1m and 24h"
	SVIDTTL *metav1.Duration `json:"svidTTL,omitempty"`

	// secretStore, when set, makes the cluster's VMs read their single-use
	// runner credential from a Vault or OpenBao server, logging in with a
	// JWT-SVID, instead of fetching it from the operator's credential
	// broker (docs/secrets-store.md). The operator writes each credential
	// once the VM's agent has attested and deletes it when the claim ends.
	// +optional
	SecretStore *SecretStoreConfig `json:"secretStore,omitempty"`

	// tpm is what TPM attestation (templates with spec.attestation.method
	// tpm) trusts and signs with on this cluster: the CAs of the TPMs'
	// endorsement keys and the CA the operator signs each VM's DevID
	// certificate with. Both are the platform team's; spire-server's
	// tpm_devid node attestor is configured with the same two
	// (docs/identity.md, "TPM"). A template with method tpm on a cluster
	// without it is not Ready (TPMNotConfigured).
	// +optional
	TPM *SPIRETPMConfig `json:"tpm,omitempty"`
}

// SPIRETPMConfig is a cluster's TPM attestation trust (docs/identity.md,
// "TPM").
type SPIRETPMConfig struct {
	// ekCABundleRef selects a Secret key with the PEM certificates of the
	// CAs that sign the TPMs' endorsement key (EK) certificates: for
	// Proxmox's virtual TPMs each node's swtpm local CA (its issuing
	// certificate as well as its root: a TPM holds no intermediates), for
	// hardware TPMs their manufacturers' CAs. A VM whose EK certificate
	// does not chain to one of them gets no DevID certificate. Give
	// spire-server's tpm_devid endorsement_ca_path the same bundle.
	// +required
	EKCABundleRef SecretKeySelector `json:"ekCABundleRef"`

	// devIDCASecretRef names the Secret (keys tls.crt and tls.key, PEM) of
	// the CA the operator signs VMs' DevID certificates with; `hyperfleet
	// tpm-devid-ca` makes one. spire-server's tpm_devid devid_ca_path
	// trusts its certificate. To rotate it, put the new certificate in
	// spire-server's bundle first, then the new key and certificate in this
	// Secret; the old certificate may leave the bundle once the DevID
	// certificates it signed expired (devIDCertificateTTL).
	// +required
	DevIDCASecretRef SecretReference `json:"devIDCASecretRef"`

	// devIDCertificateTTL is how long each VM's DevID certificate is
	// valid. A VM's spire-agent attests with it once and again when its
	// own SVID expires; a VM lives for one job, so an hour is plenty.
	// +optional
	// +kubebuilder:default="1h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('10m') && duration(self) <= duration('168h')",message="spire.tpm.devIDCertificateTTL must be between 10m and 168h"
	DevIDCertificateTTL *metav1.Duration `json:"devIDCertificateTTL,omitempty"`
}

// SecretStoreConfig is a Vault or OpenBao server the operator writes the
// VMs' runner credentials to (KV version 2), with one JWT auth role per VM
// bound to its SPIFFE ID (docs/secrets-store.md).
type SecretStoreConfig struct {
	// address is the server's https:// URL as both the operator and the
	// VMs reach it, such as https://vault.example.com:8200.
	// +required
	// +kubebuilder:validation:MinLength=9
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() == 'https' && url(self).getHostname() != '' && (url(self).getEscapedPath() == '' || url(self).getEscapedPath() == '/')",message="spire.secretStore.address must be an https:// URL without a path, such as https://vault.example.com:8200"
	Address string `json:"address"`

	// caBundleRef selects a Secret key holding the PEM CA certificates the
	// server's certificate chains to. The operator uses it, and renders it
	// into each VM's configuration. Unset: the system's roots.
	// +optional
	CABundleRef *SecretKeySelector `json:"caBundleRef,omitempty"`

	// tokenRef selects a Secret key holding the operator's own Vault token,
	// whose policy lets it write and delete credentials under pathPrefix
	// and manage the VMs' login roles (docs/secrets-store.md, "The
	// operator's policy and token"). It is read before every use, so a
	// rotated token is picked up without a restart. The Secret's namespace
	// must be one the manager reads Secrets in (--secret-namespaces).
	// +required
	TokenRef SecretKeySelector `json:"tokenRef"`

	// kvMount is where the KV version 2 secrets engine is mounted.
	// +optional
	// +kubebuilder:default="secret"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*(/[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*)*$`
	KVMount string `json:"kvMount,omitempty"`

	// pathPrefix is the path inside kvMount every credential is written
	// under: <pathPrefix>/<trust domain>/vm/<namespace>/<claim>/<uid>.
	// +optional
	// +kubebuilder:default="hyperfleet"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*(/[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*)*$`
	PathPrefix string `json:"pathPrefix,omitempty"`

	// authMount is where the JWT auth method the VMs log in at is mounted
	// (auth/<authMount>/login); its jwks_url must be the SPIRE OIDC
	// discovery provider's keys.
	// +optional
	// +kubebuilder:default="jwt"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*(/[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*)*$`
	AuthMount string `json:"authMount,omitempty"`

	// audience is the JWT-SVID audience each VM's login role is bound to
	// and its agent asks SPIRE for.
	// +optional
	// +kubebuilder:default="hyperfleet-secret-store"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[!-~]+$`
	Audience string `json:"audience,omitempty"`

	// vmPolicy is the Vault policy each VM's login token gets: the
	// templated policy that lets it read and delete its own credential only.
	// +optional
	// +kubebuilder:default="hyperfleet-vm"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`
	VMPolicy string `json:"vmPolicy,omitempty"`
}

// SPIREServerAPI is how the operator authenticates to the SPIRE Server
// API: set exactly one of adminSocket and address.
// +kubebuilder:validation:XValidation:rule="has(self.adminSocket) != has(self.address)",message="set exactly one of spire.serverAPI.adminSocket (the server's admin unix socket) and spire.serverAPI.address (mTLS with the operator's own SVID)"
// +kubebuilder:validation:XValidation:rule="!has(self.address) || has(self.workloadAPISocket)",message="spire.serverAPI.address needs spire.serverAPI.workloadAPISocket: the operator authenticates with its own X509-SVID from that socket"
// +kubebuilder:validation:XValidation:rule="has(self.address) || (!has(self.workloadAPISocket) && !has(self.serverID))",message="spire.serverAPI.workloadAPISocket and serverID apply only with spire.serverAPI.address"
type SPIREServerAPI struct {
	// adminSocket is the path, inside the operator's pod, of the SPIRE
	// server's admin unix socket (its socket_path). Only the socket's file
	// permissions guard it, so mount it into the operator alone.
	// +optional
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^/[^\x00]*$`
	AdminSocket string `json:"adminSocket,omitempty"`

	// address is the SPIRE server's API address as the operator reaches
	// it, host:port. The operator authenticates with its own X509-SVID,
	// whose SPIFFE ID must be in the server's admin_ids (or have an entry
	// with admin: true).
	// +optional
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=261
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9.-]+:[0-9]{1,5}$|^\[[0-9A-Fa-f:.]+\]:[0-9]{1,5}$`
	Address string `json:"address,omitempty"`

	// serverID is the SPIRE server's SPIFFE ID the operator expects on the
	// other end; spiffe://<trustDomain>/spire/server when unset.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^spiffe://[a-z0-9._-]+(/[A-Za-z0-9._-]+)*$`
	ServerID string `json:"serverID,omitempty"`

	// workloadAPISocket is the path, inside the operator's pod, of the
	// Workload API socket of the spire-agent that gives the operator its
	// own X509-SVID (address only).
	// +optional
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^/[^\x00]*$`
	WorkloadAPISocket string `json:"workloadAPISocket,omitempty"`
}

// DurationBounds is an inclusive range of durations.
type DurationBounds struct {
	// min is the shortest allowed duration; 1m when unset.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	Min *metav1.Duration `json:"min,omitempty"`

	// max is the longest allowed duration; 1h when unset.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	Max *metav1.Duration `json:"max,omitempty"`
}

// IdentityStatus is a claim's SPIFFE identity and where its issuance
// stands. It is written before each step it records is taken, so an
// operator restart at any point neither issues a second join token nor
// leaves a registration entry behind. It never holds the join token or the
// broker proof: the operator derives both from the claim and its own key
// (keyID) when it places them in the running VM.
//
// spiffeID, nodeID and entryID are required under either spelling: an
// identity an earlier operator wrote has spiffeId, nodeId and entryId
// until the next status write (spelling.go).
// +kubebuilder:validation:XValidation:rule="has(self.spiffeID) || has(self.spiffeId)",message="status.identity needs spiffeID"
// +kubebuilder:validation:XValidation:rule="has(self.nodeID) || has(self.nodeId)",message="status.identity needs nodeID"
// +kubebuilder:validation:XValidation:rule="has(self.entryID) || has(self.entryId)",message="status.identity needs entryID"
type IdentityStatus struct {
	// spiffeID is the VM's SPIFFE ID,
	// spiffe://<trust domain>/vm/<namespace>/<claim>/<uid>. Required.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	SPIFFEID string `json:"spiffeID,omitempty"`

	// spiffeId is the earlier spelling of spiffeID, as an earlier operator
	// wrote it: read when spiffeID is unset, replaced by spiffeID at the
	// next status write.
	//
	// Deprecated: the operator writes spiffeID. Only the schema and the
	// status write that moves it (OldStatusSpellings) read this field:
	// decoding folds it into SPIFFEID (api/v1alpha1/spelling.go).
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	DeprecatedSPIFFEID string `json:"spiffeId,omitempty"`

	// nodeID is the SPIFFE ID of the VM's spire-agent, the alias its join
	// token gives it (spiffe://<trust domain>/hyperfleet/node/...).
	// Required.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	NodeID string `json:"nodeID,omitempty"`

	// nodeId is the earlier spelling of nodeID, as an earlier operator wrote
	// it: read when nodeID is unset, replaced by nodeID at the next status
	// write.
	//
	// Deprecated: the operator writes nodeID. Only the schema and the status
	// write that moves it (OldStatusSpellings) read this field: decoding
	// folds it into NodeID (api/v1alpha1/spelling.go).
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	DeprecatedNodeID string `json:"nodeId,omitempty"`

	// entryID is the id of the VM's registration entry on the SPIRE server
	// (hyperfleet.<claim uid>). Required.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	EntryID string `json:"entryID,omitempty"`

	// entryId is the earlier spelling of entryID, as an earlier operator
	// wrote it: read when entryID is unset, replaced by entryID at the next
	// status write.
	//
	// Deprecated: the operator writes entryID. Only the schema and the
	// status write that moves it (OldStatusSpellings) read this field:
	// decoding folds it into EntryID (api/v1alpha1/spelling.go).
	// +optional
	// +kubebuilder:validation:MaxLength=255
	DeprecatedEntryID string `json:"entryId,omitempty"`

	// keyID is the id of the ownership key (in the install's key ring,
	// docs/security.md, "Ownership keys") that the VM's join token, broker
	// proof and TPM enrollment proof are derived from, recorded when the
	// identity is planned: a key rotation while the VM is in flight leaves
	// them as they were, as long as that key stays in the ring. Unset on
	// identities planned before key ids were recorded: they use the
	// ring's signing key.
	// +optional
	// +kubebuilder:validation:Minimum=0
	KeyID *int32 `json:"keyID,omitempty"`

	// keyId is the earlier spelling of keyID, as an earlier operator wrote
	// it: read when keyID is unset, replaced by keyID at the next status
	// write.
	//
	// Deprecated: the operator writes keyID. Only the schema and the status
	// write that moves it (OldStatusSpellings) read this field: decoding
	// folds it into KeyID (api/v1alpha1/spelling.go).
	// +optional
	// +kubebuilder:validation:Minimum=0
	DeprecatedKeyID *int32 `json:"keyId,omitempty"`

	// joinTokenCreatedAt is when the join token and the entries were
	// created on the SPIRE server; unset until then.
	// +optional
	JoinTokenCreatedAt *metav1.Time `json:"joinTokenCreatedAt,omitempty"`

	// joinTokenExpiresAt is when the join token stops being accepted.
	// +optional
	JoinTokenExpiresAt *metav1.Time `json:"joinTokenExpiresAt,omitempty"`

	// joinTokenDeliveredAt is when the join token and the broker proof
	// were written into the running VM through the hypervisor's guest
	// channel (for Proxmox the QEMU guest agent). Neither is ever on the
	// VM's cloud-init medium or disk.
	// +optional
	JoinTokenDeliveredAt *metav1.Time `json:"joinTokenDeliveredAt,omitempty"`

	// attestedAt is when the SPIRE server first listed the VM's agent as
	// attested.
	// +optional
	AttestedAt *metav1.Time `json:"attestedAt,omitempty"`

	// credentialRequestedAt is when the VM asked the operator's credential
	// broker for its runner credential, or, with a secrets store, when the
	// operator began to issue it and write it to the store. Set before the
	// credential is issued: a second broker request is refused.
	// +optional
	CredentialRequestedAt *metav1.Time `json:"credentialRequestedAt,omitempty"`

	// credentialStoredAt is when the VM's runner credential was written to
	// the cluster's secrets store (spec.spire.secretStore). Until it is
	// set, credentialRequestedAt says a write may have begun: the claim's
	// end deletes whatever is at the VM's path either way.
	// +optional
	CredentialStoredAt *metav1.Time `json:"credentialStoredAt,omitempty"`

	// misuse, when set, records that the VM's identity was used by someone
	// other than the VM: the claim fails without a credential being
	// handed out, and the SPIRE agent that attested with its join token is
	// evicted (docs/identity.md, "A stolen join token").
	// +optional
	Misuse *IdentityMisuse `json:"misuse,omitempty"`

	// tpm is where the VM's TPM enrollment stands (attestation method
	// tpm); unset for join tokens.
	// +optional
	TPM *TPMIdentityStatus `json:"tpm,omitempty"`

	// releasedAt is when the VM's entries and agent were deleted from the
	// SPIRE server, at the claim's end.
	// +optional
	ReleasedAt *metav1.Time `json:"releasedAt,omitempty"`
}

// TPMIdentityStatus is a VM's TPM DevID enrollment (docs/identity.md,
// "TPM"). The first TPM to enroll for a claim is its TPM for good: the
// enrollment proof reaches the claim's VM alone, and another TPM presenting
// it means the proof was taken from that VM (MisuseTPMMismatch).
type TPMIdentityStatus struct {
	// entriesCreatedAt is when the agent's alias entry (selecting the
	// DevID certificate's common name) and the VM's registration entry
	// were created on the SPIRE server.
	// +optional
	EntriesCreatedAt *metav1.Time `json:"entriesCreatedAt,omitempty"`

	// secretsDeliveredAt is when the enrollment proof and the broker proof
	// were written into the running VM through the hypervisor's guest
	// channel.
	// +optional
	SecretsDeliveredAt *metav1.Time `json:"secretsDeliveredAt,omitempty"`

	// ekFingerprint is the SHA-256 of the DER EK certificate of the TPM
	// that enrolled, in hex.
	// +optional
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{64}$`
	EKFingerprint string `json:"ekFingerprint,omitempty"`

	// devIDFingerprint is the SHA-1 of the DER DevID certificate last
	// issued, in hex: the last segment of the SPIFFE ID SPIRE gives the
	// agent that attests with it (spiffe://<td>/spire/agent/tpm_devid/<it>).
	// +optional
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{40}$`
	DevIDFingerprint string `json:"devIDFingerprint,omitempty"`

	// enrolledAt is when the DevID certificate was issued.
	// +optional
	EnrolledAt *metav1.Time `json:"enrolledAt,omitempty"`

	// devIDNotAfter is when that certificate expires.
	// +optional
	DevIDNotAfter *metav1.Time `json:"devIDNotAfter,omitempty"`
}

// Issued reports whether the claim's identity was issued on the SPIRE
// server: its join token and entries, or its TPM entries.
func (st *IdentityStatus) Issued() bool {
	return st != nil && (st.JoinTokenCreatedAt != nil || st.TPM != nil && st.TPM.EntriesCreatedAt != nil)
}

// SecretsDelivered reports whether the claim's guest secrets (join token
// or enrollment proof, and broker proof) reached its running VM.
func (st *IdentityStatus) SecretsDelivered() bool {
	return st != nil && (st.JoinTokenDeliveredAt != nil || st.TPM != nil && st.TPM.SecretsDeliveredAt != nil)
}

// IdentityMisuseReason says how a VM identity's misuse was found.
// +kubebuilder:validation:Enum=BrokerProofInvalid;JoinTokenReused;TPMMismatch
type IdentityMisuseReason string

const (
	// MisuseBrokerProofInvalid: a valid X509-SVID of the claim was
	// presented to the credential broker without the proof the operator
	// placed in the claim's VM alone.
	MisuseBrokerProofInvalid IdentityMisuseReason = "BrokerProofInvalid"
	// MisuseJoinTokenReused: the VM's spire-agent found its join token
	// spent, and the SPIRE server lists an agent that attested with it.
	MisuseJoinTokenReused IdentityMisuseReason = "JoinTokenReused"
	// MisuseTPMMismatch: the claim's enrollment proof came with a TPM
	// other than the one that enrolled for the claim first.
	MisuseTPMMismatch IdentityMisuseReason = "TPMMismatch"
)

// IdentityMisuse is a VM identity found used by someone other than its VM.
type IdentityMisuse struct {
	// reason says how the misuse was found.
	// +required
	Reason IdentityMisuseReason `json:"reason"`

	// detectedAt is when it was found.
	// +required
	DetectedAt metav1.Time `json:"detectedAt"`

	// message says what was seen (the client's address at the broker, what
	// the VM reported).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// evictedAt is when the SPIRE agent that attested with the VM's join
	// token was banned and the VM's registration entries deleted, so that
	// no SVID of this identity is issued or renewed any more.
	// +optional
	EvictedAt *metav1.Time `json:"evictedAt,omitempty"`
}
