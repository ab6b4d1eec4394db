package spire

import (
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The SPIFFE IDs HyperFleet gives out, per claim (a VM): the VM's workloads
// get VMID, and the VM's spire-agent, whose own id names its join token,
// has NodeID as its alias, the parent of the VM's workload entries. Both
// carry the claim's uid, so a claim deleted and created again under the
// same name is a different identity.
const (
	vmPathPrefix   = "vm"
	nodePathPrefix = "hyperfleet/node"
)

// VMID is spiffe://<td>/vm/<namespace>/<claim>/<uid>, the identity of the
// workloads in the VM of a claim. namespace must be a DNS label, claim a
// DNS subdomain (what Kubernetes allows for them), uid a SPIFFE ID path
// segment.
func VMID(td spiffeid.TrustDomain, namespace, claim, uid string) (spiffeid.ID, error) {
	return claimID(td, vmPathPrefix, namespace, claim, uid)
}

// NodeID is spiffe://<td>/hyperfleet/node/<namespace>/<claim>/<uid>, the
// alias of the agent in the VM of a claim (CreateJoinToken's agentID).
func NodeID(td spiffeid.TrustDomain, namespace, claim, uid string) (spiffeid.ID, error) {
	return claimID(td, nodePathPrefix, namespace, claim, uid)
}

// EntryIDFor is the id of the registration entry of the claim with uid.
func EntryIDFor(uid string) string { return EntryIDPrefix + uid }

func claimID(td spiffeid.TrustDomain, prefix, namespace, claim, uid string) (spiffeid.ID, error) {
	if err := validateClaim(namespace, claim, uid); err != nil {
		return spiffeid.ID{}, err
	}
	segments := append(strings.Split(prefix, "/"), namespace, claim, uid)
	id, err := spiffeid.FromSegments(td, segments...)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("the SPIFFE ID of claim %s/%s (uid %q): %w", namespace, claim, uid, err)
	}
	return id, nil
}

// ParseVMID is VMID's inverse: the namespace, claim and uid of a VM's id in
// td. Any other id (another trust domain, another path, a segment more or
// less, names Kubernetes would not allow) is an error.
func ParseVMID(td spiffeid.TrustDomain, id spiffeid.ID) (namespace, claim, uid string, err error) {
	if !id.MemberOf(td) {
		return "", "", "", fmt.Errorf("%q is not in the trust domain %s", id, td)
	}
	segments := strings.Split(id.Path(), "/")
	// A path starts with "/": its first segment is empty.
	if len(segments) != 5 || segments[0] != "" || segments[1] != vmPathPrefix {
		return "", "", "", fmt.Errorf("%q is not a VM's id (spiffe://%s/%s/<namespace>/<claim>/<uid>)", id, td, vmPathPrefix)
	}
	namespace, claim, uid = segments[2], segments[3], segments[4]
	if err := validateClaim(namespace, claim, uid); err != nil {
		return "", "", "", fmt.Errorf("%q is not a VM's id: %w", id, err)
	}
	return namespace, claim, uid, nil
}

func validateClaim(namespace, claim, uid string) error {
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return fmt.Errorf("namespace %q: %s", namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(claim); len(errs) > 0 {
		return fmt.Errorf("claim name %q: %s", claim, strings.Join(errs, "; "))
	}
	if err := spiffeid.ValidatePathSegment(uid); err != nil {
		return fmt.Errorf("claim uid %q: %w", uid, err)
	}
	return nil
}
