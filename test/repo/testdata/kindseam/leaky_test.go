package leaky

// A test file may name a kind: this one is not read.
const kind = "proxmox"
