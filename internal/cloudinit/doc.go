// Package cloudinit renders and merges the NoCloud seed (user-data,
// meta-data, network-config) HyperFleet puts on each VM's cloud-init ISO,
// from the variables of the claim and its template (Vars) and the tenant's
// own templates.
//
// Why it exists: every VM needs three things from cloud-init that only the
// operator knows at creation time — its identity (host name, instance id),
// its network (DHCP, a static address from an IPPool, or the user's own
// config) and the agent's config with a single-use credential — while the
// platform team wants its own cloud-config (packages, files, users) in the
// same VM. The package merges the two without either losing anything:
// the user's lists are kept and the operator's appended so the agent starts
// last, and a key both sides want is an error named for the user instead of
// a silent override (docs/architecture.md, "Cloud-init on a NoCloud ISO").
// docs/cloud-init.md states the rules for users.
//
// Templates are Go text/templates over Vars, rendered in the operator's
// process from tenant-written text; the package therefore refuses template
// definitions and calls, bounds ranges, output size and formatting widths.
//
// Vars.Canonical zeroes every per-VM value so that rendering gives the same
// bytes for every VM of one template: the input of the template drift hash
// (docs/architecture.md, "Template drift hash").
//
// Every rendered document is checked in tests by Debian's cloud-init (its
// schema validator, its user-data processor and its network-config
// converters); see validate_test.go.
package cloudinit
