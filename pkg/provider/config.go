package provider

import (
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/hyperfleet/hyperfleet/pkg/ownership"
)

// ClusterConfig is everything a Provider needs to reach and use one
// hypervisor cluster, resolved from a HypervisorCluster and its Secrets.
type ClusterConfig struct {
	// Name is the HypervisorCluster's name, used in logs and metrics.
	Name string
	// Endpoint is the API base URL, e.g. https://pve:8006/api2/json.
	Endpoint string

	// TokenID and TokenSecret are an API token ("user@realm!name" and its
	// secret); Username and Password are used when TokenID is empty.
	TokenID     string
	TokenSecret string
	Username    string
	Password    string

	// CABundle (PEM) verifies the API certificate; FingerprintSHA256 pins
	// it instead (hex, colons optional); InsecureSkipVerify turns checking
	// off (explicit opt-in only). All empty: the system trust store.
	CABundle           []byte
	FingerprintSHA256  string
	InsecureSkipVerify bool

	// ClientCertificate (PEM, leaf first, then any intermediates) and
	// ClientKey (its PEM private key) are presented to a TLS-terminating
	// proxy in front of the API that verifies client certificates; both
	// empty: none is sent. They add to the token or ticket above.
	ClientCertificate []byte
	ClientKey         []byte

	// Nodes restricts placement; empty means every online node.
	Nodes []string
	// DefaultStorage is the full-clone target when the template names none.
	DefaultStorage string
	// DefaultBridge is used when a VM's network names no bridge.
	DefaultBridge string
	// VMIDStart..VMIDEnd (inclusive) is the range of machine numbers the
	// install's VMs are numbered from on this cluster (the number in a
	// VM's ID, and in its ownership marker); the kind's section of the
	// cluster sets it (Kind.ReadCluster). Zero and zero: every number the
	// hypervisor allows.
	VMIDStart int
	VMIDEnd   int
	// ClonesPerNode and ClonesPerStorage bound concurrent clones.
	ClonesPerNode    int
	ClonesPerStorage int
	// MaxMachines caps the VMs of this install on the cluster (those that
	// exist, carrying its tag, plus those being placed); 0 means no cap.
	MaxMachines int
	// Tags are added to every VM besides the ownership tags.
	Tags []string
	// Isolated says the cluster's VMs are held to network isolation
	// policies (VMSpec.Isolation): Probe then checks that the hypervisor
	// enforces them (ClusterInfo.IsolationProblem).
	Isolated bool
	// RequestTimeout bounds one API request.
	RequestTimeout time.Duration

	// Settings is the hypervisor kind's own part of the configuration,
	// read from its section of the HypervisorCluster (spec.<kind>) by the
	// kind's registration; shared code passes it through unread and the
	// kind's provider type-asserts it.
	Settings any
}

// Deps are the collaborators a Provider is built with.
type Deps struct {
	// Signer writes and verifies ownership markers. Required.
	Signer *ownership.Signer
	// Observer receives metrics; nil means NopObserver.
	Observer Observer
	// Clock is the time source; nil means the real clock.
	Clock clock.PassiveClock
	// Log is the base logger.
	Log logr.Logger
	// Wake, when set, is told about a VM that waited (PhaseQueued) for
	// something that has just become free, such as a clone slot: its
	// caller should call EnsureVM for that owner now rather than after
	// the RetryAfter it was given. It is called outside the provider's
	// locks and must not block. Providers may never call it; callers must
	// still honour RetryAfter.
	Wake func(Owner)
}

// Factory builds Providers; the controllers hold one per hypervisor kind.
type Factory interface {
	New(cfg ClusterConfig, deps Deps) (Provider, error)
}

// FactoryFunc adapts a function to Factory.
type FactoryFunc func(cfg ClusterConfig, deps Deps) (Provider, error)

// New implements Factory.
func (f FactoryFunc) New(cfg ClusterConfig, deps Deps) (Provider, error) { return f(cfg, deps) }
