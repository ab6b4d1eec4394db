// Package machineclaim is the MachineClaim's life in one place: the
// reconciler that turns each claim into one owned VM and removes it when
// the claim ends, its per-reconcile scope and phase lists, the status it
// derives, and the services its phases call, each in its own file: the
// VM (vm.go, vm_progress.go, vm_retain.go), the static address
// (address.go), the signed VM reservation and placement record
// (reservation.go, reservation_placement.go), the SPIFFE identity
// (identity*.go), the secrets placed in the running VM (guestsecrets.go),
// the VM's name in DNS (dns.go) and its DNS and network validation
// (validation*.go), the runner on its CI platform (runner*.go), the end
// (end.go) and a
// platform admin's force-delete and disownment (admin.go). See
// docs/architecture.md, "The claim's reconcile".
package machineclaim
