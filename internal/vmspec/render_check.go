package vmspec

import (
	"cmp"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// The cloud-init of a VM is rendered twice: once with placeholder values
// for what is per VM, to check it, and only if that succeeds, once more for
// the VM. The template controller runs the same check, so that a template
// whose cloud-init or agent configuration cannot render is never Ready
// (docs/security.md, "An honest API"). No credential is ever rendered: the
// runner credential reaches the running VM only, and is issued only then.

// placeholderExpiry stands in for the join token's expiry and the secrets'
// deadline in a check render.
var placeholderExpiry = time.Date(2000, time.January, 1, 0, 0, 0, 0, time.UTC)

// withPlaceholderCredentials returns v with stand-ins for everything filled
// in per VM right before its render: the SPIFFE identity, the expiry and
// deadline, and the runner labels.
func withPlaceholderCredentials(ws *workload.Backends, v cloudinit.Vars, tmpl *hfv1.HypervisorMachineTemplate) cloudinit.Vars {
	if v.WorkloadMethod == cloudinit.WorkloadBroker {
		if v.TrustDomain == "" {
			v.TrustDomain = "placeholder.invalid"
		}
		v.SPIFFEID = "spiffe://" + v.TrustDomain + "/vm/placeholder"
		v.TrustBundle = placeholderBundle()
		if v.SPIREServerAddress == "" {
			v.SPIREServerAddress = "spire.placeholder.invalid:8081"
		}
		switch {
		case v.SecretStore != nil:
			v.SecretStoreRole = placeholderClaimUID
			v.SecretStorePath = "placeholder/" + v.TrustDomain + "/vm/placeholder/placeholder/" + placeholderClaimUID
		case v.BrokerURL == "":
			v.BrokerURL = "https://broker.placeholder.invalid/broker/v1/credential"
		}
	}
	v.ExpiresAt = cloudinit.Time{Time: placeholderExpiry}
	v.SecretsDeadline = cloudinit.Time{Time: placeholderExpiry}
	_, t, _ := ws.Template(tmpl)
	v.Labels = cloudinit.List(workload.RunnerLabels(t.DefaultLabels, []string(v.Labels)))
	return v
}

// CheckRender renders a VM's cloud-init with placeholder credentials and
// validates it, agent configuration included. The error wraps ErrRender
// and names the template and the field (and line) at fault.
func CheckRender(ws *workload.Backends, tmpl *hfv1.HypervisorMachineTemplate, v cloudinit.Vars) error {
	if _, err := cloudinit.Render(Input(tmpl, withPlaceholderCredentials(ws, v, tmpl))); err != nil {
		return fmt.Errorf("%w of HypervisorMachineTemplate %s: %w", ErrRender, tmpl.Name, err)
	}
	return nil
}

// placeholderClaimUID is the UID of the stand-in claim a template is
// checked with; it only shapes the placeholder's instance id and MAC.
const placeholderClaimUID = "00000000-0000-4000-8000-000000000000"

// CheckTemplate renders the full cloud-init of a VM of tmpl, as a
// claim would, with a stand-in claim, a placeholder address (static mode)
// and placeholder credentials. agent is the operator's agent locator (nil
// when it serves none); the caller has already checked that it serves what
// tmpl needs.
func CheckTemplate(ws *workload.Backends, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, pools []*ipam.Pool, agent AgentLocator) error {
	// A template read from a file (a sample) has no namespace; its VMs'
	// claims always have one (a generic VM's agent config names it).
	claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: cmp.Or(tmpl.Namespace, "placeholder"), Name: "placeholder", UID: placeholderClaimUID}}
	var addrs []StaticAddr
	for _, pool := range pools {
		addr := StaticAddr{Pool: pool, IP: pool.Network.Addr()}
		if len(pool.Allocatable) > 0 {
			addr.IP = pool.Allocatable[0].First
		}
		addrs = append(addrs, addr)
	}
	vars := ClaimVars(ws, claim, tmpl, cluster, addrs)
	if err := SetAgentVars(ws, tmpl, agent, &vars); err != nil {
		return err
	}
	if err := CheckRender(ws, tmpl, vars); err != nil {
		return fmt.Errorf("a VM's cloud-init does not render (checked with placeholder credentials): %w", err)
	}
	return nil
}

// placeholderBundle is a real certificate standing in for a SPIRE trust
// bundle in the render check (the agent's configuration must hold
// parsable PEM certificates).
var placeholderBundle = sync.OnceValue(func() string {
	c, err := selfsigned.New("placeholder.invalid")
	if err != nil {
		panic(fmt.Sprintf("placeholder trust bundle: %v", err))
	}
	return string(c.ChainPEM())
})
