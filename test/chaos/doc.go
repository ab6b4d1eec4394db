// Package chaos is HyperFleet's chaos run (make test-chaos, make
// test-chaos-small; build tag chaos): the manager built from cmd/hyperfleet
// as two leader-elected replicas behind one address, against the local
// world with three simulated Proxmox VE clusters (one of them in a network
// namespace), churning claims through four RunnerPools while Proxmox and
// GitHub calls fail, replicas are killed, the API server restarts, a node
// goes offline and a cluster is partitioned away; invariants are checked
// all along and at the end, and the run writes docs/reliability.md
// (docs/testing.md, "Chaos"). Test code only.
package chaos
