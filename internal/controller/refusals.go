package controller

import (
	"fmt"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// A refusal is a field the API server accepts but this operator does not
// act on (not implemented yet, or not supported in this combination). The
// object carrying it is refused at reconcile time, with Ready=False, the
// refusal's reason and a message that names the field and the way out,
// before any VM is cloned or any credential issued: an accepted field
// either works as documented or is refused (docs/security.md, "An honest
// API"). Not-yet-implemented features are refused here rather than by CEL
// so that the API stays the same when they are implemented.
type refusal struct {
	reason  string
	message string
}

// templateRefusal is the first field of tmpl this operator does not act
// on, or nil.
func templateRefusal(tmpl *hfv1.HypervisorMachineTemplate) *refusal {
	switch att := tmpl.Spec.Attestation; att.Method {
	case hfv1.AttestationJoinToken:
		return &refusal{hfv1.NotImplementedReason,
			"spec.attestation.method: join-token is not implemented yet (nor spec.attestation.joinToken.ttl); remove spec.attestation or set method: none"}
	case hfv1.AttestationTPM:
		return &refusal{hfv1.NotImplementedReason,
			"spec.attestation.method: tpm is not implemented yet (nor spec.attestation.tpm: devicePath, addVirtualTPM, ekCABundleRef); remove spec.attestation or set method: none"}
	}
	if r := tmpl.Spec.Bootstrap.GitHub.Runner; r != nil && r.OS != "" && r.OS != "linux" {
		// The operator's cloud-config starts the agent as a systemd unit
		// (docs/cloud-init.md): only Linux VMs can run it.
		return &refusal{hfv1.UnsupportedReason, fmt.Sprintf(
			"spec.bootstrap.github.runner.os: %s is not supported: the HyperFleet agent runs as a systemd service on Linux VMs only; set os: linux (or remove it) and use a Linux template", r.OS)}
	}
	return nil
}

// poolRefusal is the first field of pool this operator does not act on,
// or nil.
func poolRefusal(pool *hfv1.RunnerPool) *refusal {
	if t := pool.Spec.Workload.Type; t != hfv1.WorkloadGitHubActions {
		return &refusal{hfv1.NotImplementedReason, fmt.Sprintf(
			"spec.workload.type: %s is not implemented yet; only github-actions runners exist today: set type: github-actions with spec.workload.github", t)}
	}
	return nil
}

// claimRefusal is the first field of claim this operator does not act
// on, or nil.
func claimRefusal(claim *hfv1.MachineClaim) *refusal {
	if wc := claim.Spec.WorkloadConfig; wc != nil && wc.Type != hfv1.WorkloadGitHubActions {
		return &refusal{hfv1.NotImplementedReason, fmt.Sprintf(
			"spec.workloadConfig.type: %s is not implemented yet; only github-actions runners exist today: set type: github-actions or remove spec.workloadConfig", wc.Type)}
	}
	return nil
}

// clusterRefusal is the first field of cluster this operator does not act
// on, or nil.
func clusterRefusal(cluster *hfv1.HypervisorCluster) *refusal {
	if d := cluster.Spec.DNS; d != nil && (d.RegisterVMs || d.DNSProvider != nil) {
		return &refusal{hfv1.NotImplementedReason,
			"spec.dns.registerVMs and spec.dns.dnsProvider are not implemented yet: the operator registers no DNS records; remove both (a DHCP server with DHCP-driven DNS can register VMs by the hostname they send)"}
	}
	return nil
}
