package v1alpha1_test

import (
	"context"
	"fmt"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestDHCPStaticLeaseRules: network.dhcp.requestStaticLease and leaseTime
// are admitted with what they need (the host name sent and as client
// identifier, the image's DHCP client named, a lease time in bounds) and
// refused without it, each message naming the field and the fix. A client
// the operator cannot configure (systemd-networkd) passes admission: the
// template's validation refuses it (DHCPClientUnsupported), since what a
// client can do is the operator's to say, not the schema's.
func TestDHCPStaticLeaseRules(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	for i, dhcp := range []map[string]any{
		{"clientIdentifier": "hostname", "requestStaticLease": true, "leaseTime": "30m", "client": "isc-dhcp-client"},
		{"clientIdentifier": "hostname", "sendHostname": true, "requestStaticLease": true, "client": "isc-dhcp-client"},
		{"leaseTime": "2m", "client": "isc-dhcp-client"},
		{"leaseTime": "168h", "client": "systemd-networkd"},
		{"requestStaticLease": false},
	} {
		tmpl := validTemplate()
		tmpl.SetName(fmt.Sprintf("dhcp-lease-%d", i))
		tmpl.SetNamespace(ns)
		set(dhcp, "spec", "network", "dhcp")(tmpl)
		if err := env.Client.Create(ctx, tmpl, client.FieldValidation("Strict")); err != nil {
			t.Fatalf("network.dhcp %v was rejected: %v", dhcp, err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(ctx, tmpl) })
	}

	dhcp := func(d map[string]any) mutation { return set(d, "spec", "network", "dhcp") }
	cases := []invalidCase{
		{name: "static lease without hostname identifier", base: validTemplate, mutate: dhcp(map[string]any{"requestStaticLease": true, "client": "isc-dhcp-client"}),
			want: "network.dhcp.requestStaticLease needs clientIdentifier hostname"},
		{name: "static lease with mac identifier", base: validTemplate, mutate: dhcp(map[string]any{"requestStaticLease": true, "clientIdentifier": "mac", "client": "isc-dhcp-client"}),
			want: "set clientIdentifier: hostname"},
		{name: "static lease without sending the host name", base: validTemplate, mutate: dhcp(map[string]any{"requestStaticLease": true, "clientIdentifier": "hostname", "sendHostname": false, "client": "isc-dhcp-client"}),
			want: "network.dhcp.requestStaticLease asks for the address reserved for the VM's host name, which the VM must send: set sendHostname true"},
		{name: "static lease without client", base: validTemplate, mutate: dhcp(map[string]any{"requestStaticLease": true, "clientIdentifier": "hostname"}),
			want: "network.dhcp.requestStaticLease and network.dhcp.leaseTime are carried out by the image's DHCP client: set network.dhcp.client"},
		{name: "lease time without client", base: validTemplate, mutate: dhcp(map[string]any{"leaseTime": "1h"}),
			want: "set network.dhcp.client to it (isc-dhcp-client for ifupdown images"},
		{name: "lease time too short", base: validTemplate, mutate: dhcp(map[string]any{"leaseTime": "90s", "client": "isc-dhcp-client"}),
			want: "network.dhcp.leaseTime must be between 2m and 168h"},
		{name: "lease time too long", base: validTemplate, mutate: dhcp(map[string]any{"leaseTime": "169h", "client": "isc-dhcp-client"}),
			want: "network.dhcp.leaseTime must be between 2m and 168h"},
		{name: "lease time not a duration", base: validTemplate, mutate: dhcp(map[string]any{"leaseTime": "1 day", "client": "isc-dhcp-client"}),
			want: "spec.network.dhcp.leaseTime: Invalid value"},
		{name: "unknown client", base: validTemplate, mutate: dhcp(map[string]any{"client": "dhcpcd"}),
			want: `spec.network.dhcp.client: Unsupported value: "dhcpcd"`},
		{name: "lease time in static mode", base: validTemplate, mutate: all(set("static", "spec", "network", "mode"), set(map[string]any{"name": "v4"}, "spec", "network", "ipPoolRef"),
			dhcp(map[string]any{"leaseTime": "1h", "client": "isc-dhcp-client"})), want: "network.dhcp applies only to network.mode dhcp"},
	}
	createRejected(t, ns, "dhcp-lease-case", cases)
}
