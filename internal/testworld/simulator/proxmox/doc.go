// Package proxmoxsim is an in-memory Proxmox VE cluster that speaks
// pveproxy's REST API, for HyperFleet's tests, the local world (`hyperfleet
// dev`) and cmd/proxmox-sim: token and ticket authentication, privileges,
// Proxmox's parameter checks and error answers, worker tasks with real UPIDs,
// clones and storage locks, tags, the guest agent, /cluster/resources,
// NoCloud ISO uploads, latency and fault injection, and a guest hook that
// runs a program (or a real QEMU guest) "inside" a VM; what it models and
// what it does not is in its README.md.
//
// Everything that takes time runs on an injectable clock (simclock), so
// tests advance time instead of sleeping.
package proxmoxsim
