// Package netcheck validates a VM's name and reachability from the
// operator's own network, the checks behind a MachineClaim's
// NetworkValidated condition (docs/networking.md, "DNS and network
// validation"): forward and reverse lookups at given DNS servers
// (github.com/miekg/dns), ICMP echo (golang.org/x/net/icmp) and an SSH
// server's host key (golang.org/x/crypto/ssh, no login). Each check is
// bounded by its context; none knows about claims or Kubernetes.
package netcheck
