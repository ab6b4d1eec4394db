package vmspec

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// templateHashVersion changes when the hash's inputs change meaning, so
// that every claim is seen as stale once rather than never.
const templateHashVersion = "hyperfleet-template-hash/v1"

// hashedShape is everything besides cloud-init that shapes a VM.
type hashedShape struct {
	Source    json.RawMessage       `json:"source"`
	Resources hfv1.MachineResources `json:"resources"`
	Network   hfv1.MachineNetwork   `json:"network"`
	Bridge    string                `json:"bridge"`
	DNS       hfv1.DNSSettings      `json:"dns"`
	// Native is the kind's own cloud-init section (Kind.HashInput) when
	// the template uses the kind's own delivery, where those fields, not
	// the rendered files, reach the VM; absent otherwise, so that the hash
	// of a template that does not use it is what it was before the field
	// existed.
	Native json.RawMessage `json:"native,omitempty"`
	// AddVirtualTPM is set when the VMs get a virtual TPM of their own
	// (TPM): a VM cloned before the change has none. Omitted when false,
	// so that other templates keep the hash they had.
	AddVirtualTPM bool `json:"addVirtualTPM,omitempty"`
}

// TemplateHash is the drift hash of a template (docs/architecture.md,
// "Template drift hash"): a SHA-256 over the cloud-init rendered with every
// per-VM value zeroed, plus the source template, resources and network. It
// depends only on the template's and cluster's specs, and, for agentSource
// Operator, on the checksum of the agent binary the operator serves (a new
// agent build makes existing VMs stale, as a new template would); so it is
// stable across operator restarts and identical for every VM of the
// template.
func TemplateHash(ws *workload.Backends, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, pools []*ipam.Pool, agent AgentLocator) (string, error) {
	vars := TemplateVars(ws, tmpl, cluster, pools)
	if err := SetAgentVars(ws, tmpl, agent, &vars); err != nil {
		return "", err
	}
	out, err := cloudinit.Render(Input(tmpl, vars.Canonical()))
	if err != nil {
		return "", fmt.Errorf("spec.cloudInit does not render: %w", err)
	}
	// The template's kind hashes its own sections. A template no
	// registered kind reads is on a cluster that is refused before it has
	// a VM, so its hash goes without that part.
	var source, native json.RawMessage
	if kind, ok := provider.TemplateKind(tmpl, cluster); ok {
		if source, native, err = kind.HashInput(tmpl); err != nil {
			return "", err
		}
	}
	shape := hashedShape{
		Source:    source,
		Native:    native,
		Resources: tmpl.Spec.Resources,
		Network:   tmpl.Spec.Network,
		Bridge:    cmp.Or(tmpl.Spec.Network.Bridge, cluster.Spec.DefaultBridge),
		DNS:       DNS(cluster, tmpl),
	}
	if tpm := TPM(tmpl); tpm != nil {
		shape.AddVirtualTPM = tpm.Add
	}
	raw, err := json.Marshal(shape)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, part := range [][]byte{[]byte(templateHashVersion), out.UserData, out.MetaData, out.NetworkConfig, raw} {
		// Length-prefix each part so bytes cannot move between parts.
		fmt.Fprintf(h, "%d:", len(part))
		h.Write(part)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
