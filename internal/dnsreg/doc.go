// Package dnsreg registers a VM's addresses in DNS under its host name and
// removes them again: the forward records (A, AAAA) in the cluster's zone
// and, where a reverse zone is configured, a PTR for each address in its
// in-addr.arpa or ip6.arpa zone. It is one concern only; which name a VM
// gets, and when, is the controller's.
//
// # Back-ends
//
// A Registrar is one DNS service. Back-ends register a Factory under the
// API's dns.dnsProvider.type (Register, Registered), the way CI platforms
// do in pkg/workload; the binary's main registers those it ships: rfc2136
// (package rfc2136), dynamic UPDATE signed with TSIG, which BIND, Knot,
// PowerDNS and Windows DNS all accept; and externaldns (package
// externaldns) for type external-dns (and the refused route53 and
// cloudflare of stored clusters), which
// writes DNSEndpoint objects through the Kubernetes API (Config.Kubernetes)
// for an external-dns to publish, and keeps the owner in their labels
// rather than in DNS. The ownership marker below is rfc2136's; the rules it
// serves (a name is taken only when free or already the claim's, only the
// owner's records are changed, List finds the install's names) hold for
// every back-end, and the contract in internal/testworld/dnsregtest checks
// them.
//
// # Ownership
//
// DNS has no labels, so every name HyperFleet writes carries one TXT record
// of its own next to the addresses, written and removed in the same atomic
// update, naming the owner and the addresses HyperFleet wrote there:
//
//	vm-1.ci.example.com. 300 IN TXT "hyperfleet-claim=<claim uid> install=<operator id>" "addrs=192.0.2.10,2001:db8::10"
//
// (OwnerTXT, AddrsTXT and their parsers). Each reverse name carries the
// first string alone next to its PTR (the name is the address). The marker
// is what makes the records findable after an operator restart and safe to
// remove:
//
//   - a name is registered only when it is unused or already carries this
//     claim's TXT; a name someone else uses (a hand-made record, another
//     claim, another install) is refused with ErrNameTaken, never taken
//     over;
//   - every change to a name it owns (a new address, removal) is
//     conditional on the name's TXT RRset being as HyperFleet read it, and
//     deletes only the individual records the marker lists, so a record
//     someone else added at the same name stays; a reverse name is the
//     address of this claim's VM, so its PTRs are replaced as a whole;
//   - List reads the zones back (a zone transfer, signed with the same key)
//     and returns every name carrying a HyperFleet TXT, with its owner and
//     addresses, so a sweep can find names whose claim is gone.
//
// The install id keeps two operators that share a zone from sweeping each
// other's records. The TXT is not signed: whoever holds an update key for
// the zone is trusted, as the key already lets them change any record.
// Keeping the marker in DNS rather than only in the claim's status means
// the zone stays the single source of truth: a claim deleted while the
// operator was down, or a status lost with its object, still leaves its
// names findable.
//
// # How the controllers use it
//
// HypervisorCluster.spec.dns.dnsProvider is built into a Registrar by the
// HypervisorCluster controller (New, from the factories of Register) with a
// Config from its spec and the Secrets of its credentials
// (clusterconfig.DNS). The controller keeps it in Clusters, by cluster
// name, checks it (Checker: for rfc2136 a signed SOA query per zone, for
// externaldns the CRD and the operator's permissions) when the
// cluster or its Secret changes and once a minute, and reports the result
// in the cluster's DNSReady condition, which is not part of Ready: DNS
// never holds a VM back.
//
//   - when a claim's VM has its addresses (status.network.addresses, their
//     prefix lengths dropped, link-local ones left out as they do not
//     belong in DNS) and its cluster sets registerVMs, the claim controller
//     calls Register with status.network.fqdn, those addresses, and
//     Owner{Claim: claim UID, Install: operator id}, and reports it in the
//     claim's DNSRegistered condition. Register is idempotent and replaces
//     the addresses of a name the claim already owns, so calling it again
//     whenever the addresses change is safe. The marker lists the
//     addresses in one 255-byte TXT string, which holds six IPv6 addresses
//     at least; more are refused (ErrInvalid);
//   - when the claim ends or is deleted, the controller calls Remove with
//     the name and owner (the addresses are optional: the marker lists
//     them), a few times at most; Remove of records already gone is not an
//     error;
//   - the sweep next to the orphan VM sweep (internal/sweeper, dns.go)
//     calls List with the install's owner and Removes every record whose
//     claim UID no longer exists, after the grace period, catching claims
//     deleted while the operator was down or that gave the removal up.
//
// Errors are classified with pkg/errclass: a refused key or policy, a name
// outside the zone or taken by someone else are Configuration (the user must
// fix something, a condition says what); timeouts and server failures are
// Transient. Their reasons (DNSNameTaken, DNSNameOutOfZone,
// DNSUpdateRefused, DNSInvalid, DNSServerFailure, DNSUpdateFailed,
// DNSProviderUnsupported) have entries in docs/troubleshooting.md, which
// test/monitoring checks by scanning this package.
package dnsreg
