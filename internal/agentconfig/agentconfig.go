// Package agentconfig defines the configuration file of HyperFleet's in-VM
// agent: the one document the operator writes into a VM (through cloud-init,
// as /etc/hyperfleet/agent.json) and the agent reads when it starts.
//
// Why a package of its own: the operator and the agent are separate binaries
// built from one module, and the file between them is a contract. Keeping
// the type, its validation and its documentation in one place means a field
// cannot drift between writer and reader. The package uses the standard
// library only, so the agent, which should stay a small static binary with
// few dependencies, can import it without pulling in Kubernetes libraries.
//
// What the file holds follows docs/architecture.md, "Single-use credentials
// only": only single-use, short-lived material ever enters a VM, and none
// of it through this file, which rests on the VM's seed (the NoCloud ISO
// on the hypervisor's storage) until the guest is up. The file names where
// the secrets will arrive (secretsFile) and until when the agent waits for
// them (secretsDeadline); the operator places the GuestSecrets document
// there through the hypervisor's guest channel once the VM runs
// (docs/security.md, "Nothing replayable at rest"). In direct mode that
// document carries the single-use runner credential (a GitHub just-in-time
// runner configuration or a registration token); in broker mode the SPIRE
// join token and the broker proof, and the runner credential comes at the
// last moment from the operator's credential broker over mTLS.
package agentconfig

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"path"
	"regexp"
	"strings"
	"time"
)

// Path is where the operator writes the file inside the VM (mode 0600,
// owner root) and where the agent reads it by default.
const Path = "/etc/hyperfleet/agent.json"

// SecretsDir is the directory of the VM's secrets that never rest on a
// disk: a directory of /run (a tmpfs) that only root may enter, made at
// boot (cloud-init's bootcmd) and by the agent, mode 0700.
const SecretsDir = "/run/hyperfleet"

// SecretsFile is where the operator places the VM's GuestSecrets
// (secretsFile) through the hypervisor's guest channel once the VM runs.
// The guest channel creates the file world-readable (QEMU's guest agent
// makes new files 0666): SecretsDir's mode is what keeps it root's.
const SecretsFile = SecretsDir + "/secrets.json"

// CurrentVersion is the version of the file format described here. An agent
// refuses files of another version instead of guessing.
const CurrentVersion = 1

// Platform is the CI platform the runner belongs to: the agent runs the
// runner kind of that platform (internal/agent's runnerKind) between its
// shared steps.
type Platform string

// PlatformGeneric is no CI platform: the agent runs the template's script
// (generic.script) once, as the runner user in the work directory, and
// powers the VM off when it exits or at generic.deadline, whichever comes
// first. The CI platforms are registered by their own packages
// (RegisterPlatform, platform.go).
const PlatformGeneric Platform = "generic"

// DefaultRunnerUser is the user the VM's runner runs as: the agent's
// --run-as default (cmd/hyperfleet-agent) and the operator's default
// generic.user, which its SPIRE registration entries of generic VMs select.
const DefaultRunnerUser = "runner"

// userNameRE is a portable user name (useradd's default NAME_REGEX, at
// most 32 bytes): it goes into a SPIRE selector (unix:user:<name>) and an
// agent's user lookup.
var userNameRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// ValidUserName reports whether name is a user name generic.user takes.
func ValidUserName(name string) bool { return userNameRE.MatchString(name) }

// MaxGenericScript bounds generic.script, as the template's
// spec.bootstrap.generic.script does (64 KiB): the script rests in the
// VM's seed, which is small.
const MaxGenericScript = 64 << 10

// WorkloadMethod is how the runner credential reaches the agent.
type WorkloadMethod string

const (
	// WorkloadDirect: the operator places the single-use runner credential
	// (a JIT configuration or a registration token) in the running VM, in
	// the GuestSecrets at secretsFile. Used without attestation.
	WorkloadDirect WorkloadMethod = "direct"
	// WorkloadBroker: the file holds no runner credential. The agent
	// attests with SPIRE (join token, or a TPM DevID the operator
	// certifies: docs/identity.md, "TPM"), then
	// fetches the credential from the operator's credential broker over
	// mTLS with its X509-SVID, or from the cluster's secrets store.
	WorkloadBroker WorkloadMethod = "broker"
)

// BootstrapMethod is the kind of single-use runner credential.
type BootstrapMethod string

// The runner credentials each platform's runner takes are its own
// (MethodSpec, registered with its platform); compat.go keeps two names
// other packages still use.

// AttestationMethod is how the agent proves its identity to SPIRE.
type AttestationMethod string

const (
	// AttestationJoinToken uses a single-use SPIRE join token.
	AttestationJoinToken AttestationMethod = "join-token"
	// AttestationTPM uses the VM's TPM 2.0 (SPIRE's tpm_devid plugin family).
	AttestationTPM AttestationMethod = "tpm"
)

// Config is the content of agent.json. JSON field names are given in the
// comments; every field not marked optional is required for the methods it
// applies to.
type Config struct {
	// version is the file format version; must be CurrentVersion (1).
	Version int `json:"version"`

	// platform is the CI platform, one registered with RegisterPlatform
	// (platform.go; such as github-actions), or generic (no CI platform:
	// the generic section's script).
	Platform Platform `json:"platform"`

	// generic is what a VM of platform generic runs, and until when;
	// present exactly with platform generic.
	Generic *Generic `json:"generic,omitempty"`

	// workloadMethod is "direct" (the operator places the credential in
	// the running VM, at secretsFile) or "broker" (credential fetched from
	// the operator's broker after attestation).
	WorkloadMethod WorkloadMethod `json:"workloadMethod"`

	// bootstrapMethod is one of the platform's methods
	// (PlatformSpec.Methods, such as jit-config): the kind of runner
	// credential, whether it arrives at secretsFile or comes from the
	// broker. Empty with platform generic, which has no runner credential.
	BootstrapMethod BootstrapMethod `json:"bootstrapMethod,omitempty"`

	// jitConfig is refused: a runner credential in this file rests on the
	// VM's seed, where whoever reads the hypervisor's storage could use it
	// first. It arrives at secretsFile (GuestSecrets).
	JITConfig string `json:"jitConfig,omitempty"`

	// registrationToken is refused, as jitConfig.
	RegistrationToken string `json:"registrationToken,omitempty"`

	// secretsFile is where the running VM receives its GuestSecrets
	// through the hypervisor's guest channel: SecretsFile. Required with
	// workloadMethod direct (the runner credential), with
	// spiffe.attestationMethod join-token (the join token and the broker
	// proof) and with tpm (the enrollment proof and the broker proof).
	SecretsFile string `json:"secretsFile,omitempty"`

	// secretsDeadline, RFC 3339, is when the agent stops waiting for its
	// GuestSecrets: it then exits (ExitNoSecrets, or ExitAttestation in
	// broker mode) and powers the VM off. Required with secretsFile.
	SecretsDeadline time.Time `json:"secretsDeadline,omitzero"`

	// registrationURL is the repository or organization URL the runner
	// registers to, such as https://github.com/octo-org (bootstrapMethod
	// runner-token; optional otherwise).
	RegistrationURL string `json:"registrationURL,omitempty"`

	// runner is the runner's identity and software.
	Runner Runner `json:"runner"`

	// spiffe configures attestation with SPIRE; present exactly when
	// workloadMethod is broker.
	SPIFFE *SPIFFE `json:"spiffe,omitempty"`

	// expiresAt is when the join token the VM receives stops being usable,
	// RFC 3339 (broker mode). Optional; the agent gives up with a clear
	// message instead of trying an expired token. A runner credential's
	// expiry travels with it in the GuestSecrets.
	ExpiresAt time.Time `json:"expiresAt,omitzero"`

	// powerOffOnFinish powers the VM off when the runner exits (the
	// operator then deletes it). Normally true; false keeps a VM for
	// debugging.
	PowerOffOnFinish bool `json:"powerOffOnFinish"`

	// powerOffNotify, optional, is where the agent announces the power-off
	// just before it runs the power-off command, so that the operator
	// reads this VM's state directly instead of waiting for the
	// hypervisor's batch listing (docs/architecture.md, "Power-off
	// hints"). Best effort: the VM powers off whatever the answer.
	PowerOffNotify *PowerOffNotify `json:"powerOffNotify,omitempty"`

	// proxy, optional, is the HTTP proxy the agent and the runner use
	// (Proxy); absent: the agent's environment decides, as for any
	// program.
	Proxy *Proxy `json:"proxy,omitempty"`

	// jobMayEscalate, optional, is the template's acceptance
	// (spec.guest.jobMayEscalate) that the job user may become root in
	// the image even though the bootstrapMethod's credential serves more
	// than one job (BootstrapMethod.SingleJob): the agent then runs the
	// job instead of refusing it (ExitJobUserEscalates).
	JobMayEscalate bool `json:"jobMayEscalate,omitempty"`
}

// Generic is the work of a VM of platform generic.
type Generic struct {
	// script is the template's script (spec.bootstrap.generic.script),
	// run once by /bin/sh as the runner user in runner.software.workDir.
	// Not a secret: it rests in the VM's seed like the rest of this file;
	// a script that needs one fetches it with the VM's SPIFFE identity.
	Script string `json:"script"`
	// user is the user the script runs as (the agent's --run-as does not
	// apply to platform generic). The operator writes the same name into
	// the VM's SPIRE registration entry (selector unix:user:<name>), so
	// that the script, and no other user of the VM, fetches the VM's
	// SVIDs; the user must exist in the image.
	User string `json:"user"`
	// claim names the VM's MachineClaim, for the script's environment
	// (HYPERFLEET_CLAIM, HYPERFLEET_CLAIM_UID).
	Claim ClaimRef `json:"claim"`
	// deadline, RFC 3339, is when the VM has lived its ttl
	// (spec.bootstrap.generic.ttl from the claim's creation): the agent
	// stops the script and powers the VM off then, as a second line to
	// the operator, which ends the claim at the same time.
	Deadline time.Time `json:"deadline"`
}

// PowerOffNotify is the operator's endpoint for power-off notices.
type PowerOffNotify struct {
	// url is the https:// base URL of power-off notices (the operator's
	// agent server, path /hints/v1/power-off); the notice is POSTed to
	// <url>/<namespace>/<name>/<uid> of the claim (NoticeURL), so that
	// the operator checks the token before it reads the body.
	URL string `json:"url"`
	// token is the bearer token of this VM's claim. Secret, though it
	// authorizes nothing but one status read of this VM.
	Token string `json:"token"`
	// claim names the claim the VM belongs to: namespace, name and uid,
	// which the token is bound to.
	Claim ClaimRef `json:"claim"`
	// ca, optional, is the PEM CA bundle to trust for url; empty: the
	// system roots.
	CA string `json:"ca,omitempty"`
	// readyURL, optional, is the https:// base URL of ready hints (the
	// operator's agent server, path /hints/v1/ready): once it runs and
	// waits for its GuestSecrets, the agent POSTs an empty body to
	// <readyURL>/<namespace>/<name>/<uid> with the same token, so that
	// the operator looks at the VM now instead of at its next boot poll
	// (ReadyHintURL). A hint only: the secrets still arrive through the
	// hypervisor's guest channel alone.
	ReadyURL string `json:"readyURL,omitempty"`
}

// NoticeURL is where the notice is POSTed: url/<namespace>/<name>/<uid>
// of the claim, each part path-escaped.
func (n *PowerOffNotify) NoticeURL() string { return n.Claim.under(n.URL) }

// ReadyHintURL is where the ready hint is POSTed:
// readyURL/<namespace>/<name>/<uid> of the claim; empty without readyURL.
func (n *PowerOffNotify) ReadyHintURL() string {
	if n.ReadyURL == "" {
		return ""
	}
	return n.Claim.under(n.ReadyURL)
}

// under is base/<namespace>/<name>/<uid>, each part path-escaped.
func (c ClaimRef) under(base string) string {
	return strings.TrimRight(base, "/") + "/" + url.PathEscape(c.Namespace) + "/" +
		url.PathEscape(c.Name) + "/" + url.PathEscape(c.UID)
}

// PowerOffNotice is a power-off notice as the operator takes it: the
// claim (from the notice's URL), and what the agent saw its runner print
// (from its body). What the runner printed is the VM's word: the operator
// takes it only as a reason not to hold back the pool's other VMs while
// the job's record is on its way (docs/runnerpool.md, "Replacement
// backoff"), never as a record of the job.
type PowerOffNotice struct {
	ClaimRef
	PowerOffNoticeBody
}

// PowerOffNoticeBody is the JSON body of a power-off notice.
type PowerOffNoticeBody struct {
	// RunnerOnline: the runner printed "Listening for Jobs".
	RunnerOnline bool `json:"runnerOnline,omitempty"`
	// JobStarted: the runner printed "Running job:".
	JobStarted bool `json:"jobStarted,omitempty"`
	// ScriptExitStatus is the exit status of a generic VM's script (-1:
	// ended by a signal, such as at its deadline); nil when no script ran
	// (platform github-actions, or the agent stopped before it).
	ScriptExitStatus *int `json:"scriptExitStatus,omitempty"`
	// AttestationError, when set, says why the VM got no identity:
	// AttestationJoinTokenRefused when the SPIRE server refused its join
	// token as used (or expired); with attestationMethod tpm,
	// AttestationTPMNotFound, AttestationTPMEnrollmentRefused or
	// AttestationTPMActivationFailed. Also the VM's word: the operator asks
	// the SPIRE server whether an agent attested with that token
	// (docs/identity.md, "A stolen join token").
	AttestationError string `json:"attestationError,omitempty"`
	// GuestRefusal, when set, says why the agent refused to run the job
	// in this VM: GuestRefusalJobUserEscalates. The VM's word, for the
	// claim's status; the operator's decisions do not rest on it.
	GuestRefusal string `json:"guestRefusal,omitempty"`
}

// PowerOffNotice.AttestationError values.
const (
	// AttestationJoinTokenRefused: the SPIRE server refused the VM's join
	// token as used or expired.
	AttestationJoinTokenRefused = "JoinTokenRefused"
	// AttestationTPMNotFound: the VM has no TPM at spiffe.tpmDevicePath
	// (the template gave it none, or the guest has no driver for it).
	AttestationTPMNotFound = "TPMNotFound"
	// AttestationTPMEnrollmentRefused: the operator's TPM enrollment
	// endpoints refused the VM's enrollment or its answer to the
	// challenge (an error status other than 429 and 503; the agent logs
	// the operator's reason).
	AttestationTPMEnrollmentRefused = "TPMEnrollmentRefused"
	// AttestationTPMActivationFailed: the VM's TPM could not recover the
	// operator's credential activation challenge (TPM2_ActivateCredential
	// failed): the challenge was made for another TPM's keys.
	AttestationTPMActivationFailed = "TPMActivationFailed"
)

// GuestSecrets is the document the operator places at secretsFile in the
// running VM, and nowhere else: never on the VM's cloud-init medium or
// disk. It carries what the VM's mode needs: the runner credential
// (workloadMethod direct), the join token and the broker proof
// (spiffe.attestationMethod join-token), or the enrollment proof and the
// broker proof (tpm).
type GuestSecrets struct {
	// joinToken is the VM's single-use SPIRE join token.
	JoinToken string `json:"joinToken,omitempty"`
	// brokerProof is what the agent sends the credential broker besides
	// its X509-SVID (header BrokerProofHeader): whoever attests with a
	// join token stolen elsewhere (an old seed, the SPIRE server's
	// datastore, a log) has the SVID but not the proof, and the broker
	// then reports the theft instead of handing out the credential.
	BrokerProof string `json:"brokerProof,omitempty"`
	// enrollmentProof is what the agent sends the TPM enrollment endpoints
	// (header EnrollmentProofHeader, attestation method tpm): only the VM
	// the operator created receives it, through the hypervisor's guest
	// channel, so a copy of the seed on another VM enrolls no TPM.
	EnrollmentProof string `json:"enrollmentProof,omitempty"`
	// jitConfig is GitHub's encoded just-in-time runner configuration
	// (bootstrapMethod jit-config).
	JITConfig string `json:"jitConfig,omitempty"`
	// registrationToken is a GitHub runner registration token
	// (bootstrapMethod runner-token), a Buildkite agent token
	// (agent-token) or a GitLab runner authentication token
	// (runner-auth-token), registrationURL where it registers (optional:
	// the config's registrationURL otherwise).
	RegistrationToken string `json:"registrationToken,omitempty"`
	RegistrationURL   string `json:"registrationURL,omitempty"`
	// job is the Buildkite job (UUID) a job acquisition token
	// (registrationToken, bootstrapMethod job-token) is for: the agent
	// acquires that job and no other. A warm VM learns its job here, when
	// its pool binds it one. Empty for every other credential.
	Job string `json:"job,omitempty"`
	// expiresAt is when the runner credential stops being usable;
	// optional.
	ExpiresAt time.Time `json:"expiresAt,omitzero"`
	// fresh is what the guest takes from the operator before it uses
	// any secret of the document (internal/agent, freshen).
	Fresh *Freshness `json:"fresh,omitempty"`
}

// Freshness is what a guest cannot trust its own state for after it was
// suspended to disk (a standby VM, resumed for its job): its clock ran on
// from the moment of the suspend, and its random number generator's state
// was saved with its memory on the hypervisor's storage, where a reader
// of that storage could learn it. The operator places it with every
// secrets document, through the guest channel (so it never rests on
// storage); the agent mixes Entropy into the kernel's pool, reseeding it,
// and steps its clock to the operator's (Time, plus the time since the
// document was written by the guest's own clock) when it is further off
// than MaxClockSkew, before anything of the document is used.
type Freshness struct {
	// time is the operator's clock when it placed the document.
	Time time.Time `json:"time"`
	// entropy is FreshEntropyBytes random bytes drawn for this VM alone
	// (base64 in JSON).
	Entropy []byte `json:"entropy"`
	// resumed says the operator resumed the VM from its standby tier (a
	// suspend to disk) before this delivery: the agent renews its DHCP
	// leases whatever its clock says.
	Resumed bool `json:"resumed,omitempty"`
}

// FreshEntropyBytes is the size of Freshness.Entropy: 256 bits, what
// Linux's CRNG seeds itself with.
const FreshEntropyBytes = 32

// MaxClockSkew is how far the guest's clock may be from Freshness.Time
// before the agent steps it: more than the delivery's own delay (the
// guest channel's write, the agent's poll), less than anything a TLS
// certificate's or a token's validity would notice.
const MaxClockSkew = time.Second

// BrokerProofHeader carries GuestSecrets.BrokerProof to the broker.
const BrokerProofHeader = "Hyperfleet-Broker-Proof"

// ParseGuestSecrets decodes a GuestSecrets document; a document cut short
// (read while it was being written) is an error, as is one that carries
// none of a join token with its broker proof, an enrollment proof with
// its broker proof, or exactly one runner credential. A join token with an
// enrollment proof is refused: a VM attests one way. Whether the kind
// matches the config's attestationMethod is the agent's to check. Errors
// never quote the document.
func ParseGuestSecrets(data []byte) (GuestSecrets, error) {
	var g GuestSecrets
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&g); err != nil {
		return GuestSecrets{}, fmt.Errorf("the guest secrets (%d bytes) are not a complete JSON document of joinToken or enrollmentProof and brokerProof, or of a runner credential", len(data))
	}
	if _, err := dec.Token(); err != io.EOF {
		return GuestSecrets{}, errors.New("the guest secrets have data after the JSON object")
	}
	identity := g.JoinToken != "" || g.EnrollmentProof != "" || g.BrokerProof != ""
	runner := g.JITConfig != "" || g.RegistrationToken != ""
	switch {
	case g.JoinToken != "" && g.EnrollmentProof != "":
		return GuestSecrets{}, errors.New("the guest secrets carry both a joinToken and an enrollmentProof; a VM attests either with a join token or with its TPM")
	case identity && (g.JoinToken == "" && g.EnrollmentProof == "" || g.BrokerProof == ""):
		return GuestSecrets{}, errors.New("the guest secrets lack joinToken (or enrollmentProof) or brokerProof")
	case g.JITConfig != "" && g.RegistrationToken != "":
		return GuestSecrets{}, errors.New("the guest secrets carry both a jitConfig and a registrationToken; a VM gets one runner credential")
	case !identity && !runner:
		return GuestSecrets{}, errors.New("the guest secrets carry neither a join token nor a runner credential")
	case g.Fresh != nil && (g.Fresh.Time.IsZero() || len(g.Fresh.Entropy) != FreshEntropyBytes):
		return GuestSecrets{}, fmt.Errorf("the guest secrets' fresh part needs a time and %d bytes of entropy (it has %d)", FreshEntropyBytes, len(g.Fresh.Entropy))
	}
	return g, nil
}

// ClaimRef names a MachineClaim.
type ClaimRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
}

// Runner is the runner's identity on GitHub and its software in the VM.
type Runner struct {
	// name is the runner's name on GitHub (required for runner-token; the
	// JIT configuration already carries it). Letters, digits, ".", "_", "-";
	// at most 64 characters.
	Name string `json:"name,omitempty"`

	// labels are the runner's labels (runner-token; the JIT configuration
	// already carries them). No commas or white space.
	Labels []string `json:"labels,omitempty"`

	// group is the organization runner group (runner-token; optional).
	Group string `json:"group,omitempty"`

	// acquireJob is the Buildkite job (UUID) the VM was made for
	// (bootstrapMethod job-token, and only then); optional: the job comes
	// with the credential (GuestSecrets.job), which must then name the
	// same. buildkite-agent starts with --acquire-job and takes that job
	// or none.
	AcquireJob string `json:"acquireJob,omitempty"`

	// software says where the runner package comes from and where it lives.
	Software Software `json:"software"`
}

// Software is the runner package and its place in the VM.
type Software struct {
	// downloadURL is the https:// URL of the runner package, with {os} and
	// {arch} already replaced. Optional: empty means the runner is installed
	// in the image at installPath.
	DownloadURL string `json:"downloadURL,omitempty"`

	// downloadSHA256 is the package's SHA-256 (64 lower-case hex digits);
	// required with downloadURL. The agent refuses a package that does not
	// match.
	DownloadSHA256 string `json:"downloadSHA256,omitempty"`

	// installPath is the absolute directory the runner is (or is unpacked)
	// in, such as /opt/actions-runner.
	InstallPath string `json:"installPath"`

	// workDir is the absolute job working directory, wiped after the job.
	WorkDir string `json:"workDir"`

	// configScript is the runner's registration script in installPath,
	// such as config.sh (a file name, no directory).
	ConfigScript string `json:"configScript"`

	// runScript is the runner's run script in installPath, such as run.sh.
	RunScript string `json:"runScript"`

	// os is the runner package's operating system in GitHub's naming:
	// linux, win or osx.
	OS string `json:"os"`

	// arch is the runner package's architecture in GitHub's naming: x64,
	// arm64 or arm.
	Arch string `json:"arch"`
}

// SPIFFE configures the agent's SPIRE attestation and the broker it asks
// for its runner credential.
type SPIFFE struct {
	// attestationMethod is "join-token" or "tpm".
	AttestationMethod AttestationMethod `json:"attestationMethod"`

	// joinToken is refused: the join token never rests on the VM's seed
	// or disk. It reaches the running VM in the GuestSecrets at the
	// config's secretsFile.
	JoinToken string `json:"joinToken,omitempty"`

	// tpmDevicePath is the TPM device, such as /dev/tpmrm0 (tpm only,
	// required there): the agent enrolls a DevID in it and spire-agent's
	// tpm_devid attestor uses it.
	TPMDevicePath string `json:"tpmDevicePath,omitempty"`

	// spiffeID is the SPIFFE ID the VM is expected to receive, such as
	// spiffe://hyperfleet.io/vm/ci/runner-abc/<uid>. Optional with
	// join-token, required with tpm (the TPM enrollment names the VM by
	// it); when set the agent checks its SVID against it.
	SPIFFEID string `json:"spiffeID,omitempty"`

	// trustDomain is the SPIFFE trust domain, such as hyperfleet.io.
	TrustDomain string `json:"trustDomain"`

	// trustBundle is the PEM-encoded SPIRE server CA bundle (one or more
	// CERTIFICATE blocks) the agent bootstraps trust from.
	TrustBundle string `json:"trustBundle"`

	// serverAddress is the SPIRE server as host:port.
	ServerAddress string `json:"serverAddress"`

	// brokerURL is the https:// URL of the operator's credential broker;
	// optional when secretStore is set, except with attestationMethod tpm:
	// the TPM enrollment endpoints are on its host (TPMEnrollPath), and
	// with secretStore it serves only them.
	BrokerURL string `json:"brokerURL,omitempty"`

	// brokerCA is the PEM-encoded CA bundle (one or more CERTIFICATE
	// blocks) the broker's server certificate is verified against.
	// Optional: empty means the VM's system roots.
	BrokerCA string `json:"brokerCA,omitempty"`

	// secretStore is the Vault or OpenBao server the agent reads its runner
	// credential from, after logging in with a JWT-SVID. Optional; when set
	// the agent uses it instead of the broker.
	SecretStore *SecretStore `json:"secretStore,omitempty"`
}

var (
	runnerNameRE  = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
	scriptNameRE  = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
	sha256RE      = regexp.MustCompile(`^[a-f0-9]{64}$`)
	trustDomainRE = regexp.MustCompile(`^[a-z0-9._-]{1,255}$`)
)

// Validate reports every problem with c at once (joined with errors.Join),
// each naming the JSON field and saying what would be right.
func (c *Config) Validate() error {
	var errs []error
	secrets := c.secrets()
	bad := func(field, format string, args ...any) {
		// Messages quote the values they reject; none may show a
		// credential, wherever a caller put it.
		errs = append(errs, fmt.Errorf("%s: %s", field, RedactSecrets(fmt.Sprintf(format, args...), secrets...)))
	}

	if c.Version != CurrentVersion {
		bad("version", "is %d; this agent reads version %d", c.Version, CurrentVersion)
	}
	generic := c.Platform == PlatformGeneric
	spec, known := LookupPlatform(c.Platform)
	switch {
	case generic:
		if c.BootstrapMethod != "" {
			bad("bootstrapMethod", "is %q but platform is generic, which has no runner credential; remove it", c.BootstrapMethod)
		}
		c.validateGeneric(bad)
	case !known:
		bad("platform", "is %q; must be one of %q", c.Platform, RegisteredPlatforms())
	case c.Generic != nil:
		bad("generic", "is set but platform is %q; it applies only to platform generic", c.Platform)
	default:
		spec.ValidateMethod(c, bad)
		spec.Validate(c, bad)
	}

	switch c.WorkloadMethod {
	case WorkloadDirect:
		if c.SPIFFE != nil {
			bad("spiffe", "is set but workloadMethod is direct; SPIFFE attestation implies workloadMethod broker")
		}
		if c.SecretsFile == "" && !generic {
			bad("secretsFile", "is empty; workloadMethod direct needs where the operator places the runner credential in the running VM, %s", SecretsFile)
		}
	case WorkloadBroker:
		if c.SPIFFE == nil {
			bad("spiffe", "is missing; workloadMethod broker needs SPIFFE attestation settings")
		}
	default:
		bad("workloadMethod", "is %q; must be %q or %q", c.WorkloadMethod, WorkloadDirect, WorkloadBroker)
	}

	for field, v := range map[string]string{"jitConfig": c.JITConfig, "registrationToken": c.RegistrationToken} {
		if v != "" {
			bad(field, "must not be in the config: a runner credential written to the VM's seed can be read off the hypervisor's storage and used first; the operator places it in the running VM at secretsFile (docs/security.md, \"Nothing replayable at rest\"). An agent from before that change reads it here: update the agent")
		}
	}
	c.validateSecretsFile(bad)
	switch {
	case c.Runner.Software.OS != "win":
	case !spec.Windows:
		bad("runner.software.os", "is win, which the agent does not run for platform %s (docs/windows.md)", c.Platform)
	case c.WorkloadMethod != WorkloadDirect:
		bad("runner.software.os", "is win, which the agent runs only for platform %s with workloadMethod %s (docs/windows.md)", c.Platform, WorkloadDirect)
	}
	if c.RegistrationURL != "" {
		if err := checkHTTPSURL(c.RegistrationURL); err != nil {
			bad("registrationURL", "%v", err)
		}
	}
	if generic {
		checkRunnerDir(bad, "runner.software.workDir", c.Runner.Software.WorkDir, c.Runner.Software.OS)
	}
	if c.SPIFFE != nil {
		// A generic VM fetches no runner credential: it needs the
		// identity only, not the broker.
		c.SPIFFE.validate(c.SecretsFile, !generic, bad)
	}
	if c.Proxy != nil {
		c.Proxy.validate(bad)
	}
	if c.PowerOffNotify != nil {
		c.PowerOffNotify.validate(bad)
	}
	return errors.Join(errs...)
}

// validateSecretsFile checks secretsFile and secretsDeadline; which modes
// need them is checked with the mode.
func (c *Config) validateSecretsFile(bad func(field, format string, args ...any)) {
	if c.SecretsFile == "" {
		if !c.SecretsDeadline.IsZero() {
			bad("secretsDeadline", "is set but secretsFile is empty; remove it")
		}
		return
	}
	if c.Runner.Software.OS == "win" {
		if !IsWindowsAbs(c.SecretsFile) {
			bad("secretsFile", "%q must be the absolute Windows path the operator places the VM's secrets at, %s", c.SecretsFile, WindowsSecretsFile)
		}
	} else if !path.IsAbs(c.SecretsFile) || path.Clean(c.SecretsFile) != c.SecretsFile {
		bad("secretsFile", "%q must be the absolute path the operator places the VM's secrets at, %s", c.SecretsFile, SecretsFile)
	}
	if c.SecretsDeadline.IsZero() {
		bad("secretsDeadline", "is empty; with secretsFile the agent needs to know until when the operator may place its secrets")
	}
}

func (n *PowerOffNotify) validate(bad func(field, format string, args ...any)) {
	if u, err := url.Parse(n.URL); err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil {
		bad("powerOffNotify.url", "%q is not an https:// URL without credentials", n.URL)
	}
	if n.ReadyURL != "" {
		if u, err := url.Parse(n.ReadyURL); err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil {
			bad("powerOffNotify.readyURL", "%q is not an https:// URL without credentials", n.ReadyURL)
		}
	}
	if n.Token == "" {
		bad("powerOffNotify.token", "is empty")
	}
	if n.Claim.Namespace == "" || n.Claim.Name == "" || n.Claim.UID == "" {
		bad("powerOffNotify.claim", "needs namespace, name and uid")
	}
	if n.CA != "" {
		if err := CheckPEMBundle(n.CA, "the CA bundle of the operator's agent server (or leave it empty for the system roots)"); err != nil {
			bad("powerOffNotify.ca", "%v", err)
		}
	}
}

func (r *Runner) validate(bad func(field, format string, args ...any)) {
	if r.Name != "" && !runnerNameRE.MatchString(r.Name) {
		bad("runner.name", "%q is not a valid runner name: use at most 64 letters, digits, '.', '_' or '-'", r.Name)
	}
	for i, l := range r.Labels {
		if l == "" || len(l) > 64 || strings.ContainsAny(l, ", \t\r\n") {
			bad(fmt.Sprintf("runner.labels[%d]", i), "%q is not a valid label: 1 to 64 characters without commas or white space", l)
		}
	}
	if len(r.Group) > 100 {
		bad("runner.group", "is longer than 100 characters")
	}
	s := &r.Software
	if s.DownloadURL != "" {
		if err := checkHTTPSURL(s.DownloadURL); err != nil {
			bad("runner.software.downloadURL", "%v", err)
		}
		if strings.Contains(s.DownloadURL, "{os}") || strings.Contains(s.DownloadURL, "{arch}") {
			bad("runner.software.downloadURL", "still contains {os} or {arch}; the operator replaces them before writing the file")
		}
		if s.DownloadSHA256 == "" {
			bad("runner.software.downloadSHA256", "is empty; a downloaded runner package must be checked against its SHA-256")
		}
	}
	if s.DownloadSHA256 != "" && !sha256RE.MatchString(s.DownloadSHA256) {
		bad("runner.software.downloadSHA256", "must be 64 lower-case hex digits")
	}
	checkRunnerDir(bad, "runner.software.installPath", s.InstallPath, s.OS)
	checkRunnerDir(bad, "runner.software.workDir", s.WorkDir, s.OS)
	if !scriptNameRE.MatchString(s.ConfigScript) {
		bad("runner.software.configScript", "%q must be a file name in installPath, such as config.sh", s.ConfigScript)
	}
	if !scriptNameRE.MatchString(s.RunScript) {
		bad("runner.software.runScript", "%q must be a file name in installPath, such as run.sh", s.RunScript)
	}
	switch s.OS {
	case "linux", "win", "osx":
	default:
		bad("runner.software.os", "is %q; must be linux, win or osx", s.OS)
	}
	switch s.Arch {
	case "x64", "arm64", "arm":
	default:
		bad("runner.software.arch", "is %q; must be x64, arm64 or arm", s.Arch)
	}
}

// checkRunnerDir checks a directory the agent removes or empties as root
// (or, on Windows, as SYSTEM), with the rules of the VM's os.
func checkRunnerDir(bad func(field, format string, args ...any), field, p, os string) {
	if os == "win" {
		if why := CheckWindowsRunnerPath(p); why != "" {
			bad(field, "%q %s; the agent empties it after each job: use a directory of its own such as C:\\actions-runner", p, why)
		}
		return
	}
	if p == "" || !path.IsAbs(p) || strings.ContainsRune(p, 0) {
		bad(field, "%q must be an absolute path such as /opt/actions-runner", p)
		return
	}
	if why := CheckRunnerPath(p); why != "" {
		bad(field, "%q %s; the agent empties it after each job: use a directory of its own such as /opt/actions-runner or /var/lib/hyperfleet/work", p, why)
	}
}

// validateGeneric checks the generic section of a platform generic config.
func (c *Config) validateGeneric(bad func(field, format string, args ...any)) {
	g := c.Generic
	if g == nil {
		bad("generic", "is missing; platform generic needs the script to run and its deadline")
		return
	}
	switch {
	case strings.TrimSpace(g.Script) == "":
		bad("generic.script", "is empty; platform generic runs the template's spec.bootstrap.generic.script")
	case len(g.Script) > MaxGenericScript:
		bad("generic.script", "is %d bytes; at most %d", len(g.Script), MaxGenericScript)
	case strings.ContainsRune(g.Script, 0):
		bad("generic.script", "contains a NUL byte, which /bin/sh cannot read")
	}
	if !ValidUserName(g.User) {
		bad("generic.user", "is %q; must be a user name of the VM (lower-case letters, digits, _ and -, at most 32 bytes), the one the script runs as", g.User)
	}
	if g.Claim.Namespace == "" || g.Claim.Name == "" || g.Claim.UID == "" {
		bad("generic.claim", "needs namespace, name and uid")
	}
	if g.Deadline.IsZero() {
		bad("generic.deadline", "is empty; platform generic needs when the VM's ttl ends, RFC 3339")
	}
}

// validate checks s; needBroker is false where the VM fetches no runner
// credential (platform generic), so that neither the broker nor the
// secrets store is needed.
func (s *SPIFFE) validate(secretsFile string, needBroker bool, bad func(field, format string, args ...any)) {
	if s.JoinToken != "" {
		bad("spiffe.joinToken", "must not be in the config: a join token written to the VM's seed can be read off the storage and used first; the operator places it in the running VM at secretsFile (docs/identity.md)")
	}
	switch s.AttestationMethod {
	case AttestationJoinToken:
		if secretsFile == "" {
			bad("secretsFile", "is empty; spiffe.attestationMethod join-token needs where the operator places the join token in the running VM, %s", SecretsFile)
		}
		if s.TPMDevicePath != "" {
			bad("spiffe.tpmDevicePath", "is set but attestationMethod is join-token; remove it")
		}
	case AttestationTPM:
		if secretsFile == "" {
			bad("secretsFile", "is empty; spiffe.attestationMethod tpm needs where the operator places the enrollment proof and the broker proof in the running VM, %s", SecretsFile)
		}
		switch {
		case s.TPMDevicePath == "":
			bad("spiffe.tpmDevicePath", "is empty; spiffe.attestationMethod tpm needs the VM's TPM device, such as /dev/tpmrm0")
		case !strings.HasPrefix(s.TPMDevicePath, "/dev/") || path.Clean(s.TPMDevicePath) != s.TPMDevicePath:
			bad("spiffe.tpmDevicePath", "%q must be a device path such as /dev/tpmrm0", s.TPMDevicePath)
		}
		if s.SPIFFEID == "" {
			// TPMEnrollRequest names the VM's claim by it.
			bad("spiffe.spiffeID", "is empty; spiffe.attestationMethod tpm names the VM to the operator's enrollment endpoints by its SPIFFE ID")
		}
	default:
		bad("spiffe.attestationMethod", "is %q; must be %q or %q", s.AttestationMethod, AttestationJoinToken, AttestationTPM)
	}
	if !trustDomainRE.MatchString(s.TrustDomain) {
		bad("spiffe.trustDomain", "%q is not a SPIFFE trust domain such as hyperfleet.io (lower-case letters, digits, '.', '_', '-')", s.TrustDomain)
	}
	if s.SPIFFEID != "" {
		u, err := url.Parse(s.SPIFFEID)
		switch {
		case err != nil || u.Scheme != "spiffe" || u.Host == "":
			bad("spiffe.spiffeID", "%q is not a SPIFFE ID such as spiffe://hyperfleet.io/vm/ns/name/uid", s.SPIFFEID)
		case s.TrustDomain != "" && u.Host != s.TrustDomain:
			bad("spiffe.spiffeID", "%q is not in trust domain %q", s.SPIFFEID, s.TrustDomain)
		}
	}
	if err := CheckPEMBundle(s.TrustBundle, "the SPIRE server's CA bundle"); err != nil {
		bad("spiffe.trustBundle", "%v", err)
	}
	if s.BrokerCA != "" {
		if err := CheckPEMBundle(s.BrokerCA, "the CA bundle of the broker's server certificate (or leave it empty for the system roots)"); err != nil {
			bad("spiffe.brokerCA", "%v", err)
		}
	}
	if host, port, err := net.SplitHostPort(s.ServerAddress); err != nil || host == "" || port == "" {
		bad("spiffe.serverAddress", "%q must be host:port, such as spire.example.com:8081", s.ServerAddress)
	}
	switch {
	case s.AttestationMethod == AttestationTPM:
		// The TPM enrollment endpoints are on the broker's host
		// (TPMEnrollPath), also when the credential comes from the
		// secrets store.
		if s.BrokerURL == "" {
			bad("spiffe.brokerURL", "is empty; spiffe.attestationMethod tpm enrolls the VM's TPM at the operator's agent server, whose URL it is (%s on its host)", TPMEnrollPath)
		} else if err := checkHTTPSURL(s.BrokerURL); err != nil {
			bad("spiffe.brokerURL", "%v", err)
		}
		if s.SecretStore != nil {
			s.SecretStore.validate(bad)
		}
	case !needBroker:
		if s.BrokerURL != "" {
			if err := checkHTTPSURL(s.BrokerURL); err != nil {
				bad("spiffe.brokerURL", "%v", err)
			}
		}
	case s.SecretStore != nil:
		if s.BrokerURL != "" {
			bad("spiffe.brokerURL", "is set but so is spiffe.secretStore; the credential comes from one of them: remove one")
		}
		s.SecretStore.validate(bad)
	default:
		if err := checkHTTPSURL(s.BrokerURL); err != nil {
			bad("spiffe.brokerURL", "%v; or set spiffe.secretStore to read the credential from Vault or OpenBao", err)
		}
	}
}

func checkHTTPSURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("%q must be an https:// URL", shownURL(s, u, err))
	}
	return nil
}

// shownURL is what an error may quote of a URL: without its user
// information and query, which may hold credentials, or only its length
// when it does not parse.
func shownURL(s string, u *url.URL, err error) string {
	if err != nil {
		return fmt.Sprintf("<%d characters that do not parse as a URL>", len(s))
	}
	c := *u
	if c.User != nil {
		c.User = url.User("redacted")
	}
	if c.RawQuery != "" {
		c.RawQuery = "redacted"
	}
	c.Fragment, c.RawFragment = "", ""
	return c.String()
}

// CheckPEMBundle checks that bundle is PEM CERTIFICATE blocks only, at
// least one, each a certificate that parses: what a VM's agent accepts as
// a trust bundle. what names the bundle in the fix its messages suggest.
// The operator checks its own CA files with it too, so that a file the
// agent would refuse is refused where it is read.
func CheckPEMBundle(bundle, what string) error {
	rest := []byte(bundle)
	n := 0
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return fmt.Errorf("holds a %q PEM block; only CERTIFICATE blocks belong in a trust bundle: it must be %s", block.Type, what)
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return fmt.Errorf("certificate %d does not parse: %w", n+1, err)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("holds no PEM CERTIFICATE block; it must be %s in PEM", what)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return errors.New("has text after the last PEM block")
	}
	return nil
}

// Marshal encodes c as indented JSON with a final newline, the form the
// operator writes. It does not validate; call Validate first.
func (c *Config) Marshal() ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(c); err != nil {
		return nil, fmt.Errorf("encode agent config: %w", err)
	}
	return buf.Bytes(), nil
}

// Parse decodes and validates an agent.json document. Unknown fields and
// trailing data are errors, so a typo in a hand-written file is caught
// instead of silently ignored.
func Parse(data []byte) (*Config, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var c Config
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("agent config: unexpected data after the JSON object")
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	return &c, nil
}
