package chart_test

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestAgentServiceKeepsVMAddresses: a NodePort or LoadBalancer agent
// Service keeps the VMs' source addresses (externalTrafficPolicy Local),
// so that the agent server's per-address caps count VMs: with Cluster
// every VM arrives from a node's address, and one or two hostile jobs held
// the whole cap. A ClusterIP Service has no such policy (as in config/),
// and Cluster can be chosen.
func TestAgentServiceKeepsVMAddresses(t *testing.T) {
	for _, c := range []struct {
		set  []string
		want corev1.ServiceExternalTrafficPolicy
	}{
		{nil, ""},
		{[]string{"agentServer.service.type=LoadBalancer"}, corev1.ServiceExternalTrafficPolicyLocal},
		{[]string{"agentServer.service.type=NodePort"}, corev1.ServiceExternalTrafficPolicyLocal},
		{[]string{"agentServer.service.type=LoadBalancer", "agentServer.service.externalTrafficPolicy=Cluster"}, corev1.ServiceExternalTrafficPolicyCluster},
	} {
		var extra []string
		for _, s := range c.set {
			extra = append(extra, "--set", s)
		}
		var svc corev1.Service
		convert(t, find(t, render(t, defaults, extra...), "Service", defaults.fullname()+"-agent"), &svc)
		if svc.Spec.ExternalTrafficPolicy != c.want {
			t.Errorf("--set %v: externalTrafficPolicy %q, want %q", c.set, svc.Spec.ExternalTrafficPolicy, c.want)
		}
	}
}

// TestAgentServerBoundsReachTheManager: the agent server's caps, its
// reserve and its download timeout are passed as the manager's flags.
func TestAgentServerBoundsReachTheManager(t *testing.T) {
	base := []string{"--set", "agentServer.enabled=true", "--set", "agentServer.url=https://agents.example.com:9443"}
	_, ctr := managerPod(t, render(t, defaults, base...), defaults)
	for _, want := range []string{"--agent-server-max-conns=256", "--agent-server-max-conns-per-address=32",
		"--agent-server-reserved-conns=32", "--agent-server-reserved-conns-per-address=2"} {
		if !slices.Contains(ctr.Args, want) {
			t.Errorf("the manager's args lack %s: %v", want, ctr.Args)
		}
	}
	for _, a := range ctr.Args {
		if strings.HasPrefix(a, "--agent-server-download-timeout") {
			t.Errorf("the default download timeout is passed (%s): the manager derives it", a)
		}
	}
	_, ctr = managerPod(t, render(t, defaults, append(base, "--set", "agentServer.downloadTimeout=5m")...), defaults)
	if !slices.Contains(ctr.Args, "--agent-server-download-timeout=5m") {
		t.Errorf("agentServer.downloadTimeout=5m: args %v", ctr.Args)
	}
}
