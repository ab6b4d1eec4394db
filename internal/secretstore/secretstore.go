// Package secretstore is how the operator hands a VM its single-use runner
// credential through a secrets store instead of the credential broker: it
// writes the credential under a path derived from the VM's SPIFFE ID, and
// the VM, once it holds a JWT-SVID for that ID, reads it once and deletes it
// (internal/agent's VaultSource). The back-ends (vault/ beneath) speak to a
// real store; this package holds the neutral contract and the path scheme.
package secretstore

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
)

// Credential is the document stored for one VM: the single-use runner
// credential in the form the agent reads.
type Credential = agentconfig.StoredCredential

// Store keeps each VM's runner credential until the VM has read it.
//
// Retry contract: Put is create-only. A second Put for an id whose
// credential is still stored fails with ErrExists, so an operator that
// restarts between minting a credential and recording it never leaves two
// credentials for one VM; the caller treats ErrExists as "already handed
// over" (or deletes and mints anew). Delete is idempotent: a credential the
// VM already consumed, or that was never written, is not an error. Other
// errors are classified with errclass: Transient ones may be retried.
type Store interface {
	// Put stores cred for the VM whose SPIFFE ID is id.
	Put(ctx context.Context, id spiffeid.ID, cred Credential) error
	// Delete removes whatever is stored for id, and every trace of it the
	// store keeps (versions, metadata, the VM's login role).
	Delete(ctx context.Context, id spiffeid.ID) error
}

var (
	// ErrExists: a credential is already stored for this SPIFFE ID.
	ErrExists = errclass.NewSentinel("a credential is already stored for this SPIFFE ID", errclass.ClassPermanent, "CredentialExists")
	// ErrDenied: the store refused the operator's token (permission denied,
	// expired or revoked token); the user must fix the token or its policy.
	ErrDenied = errclass.NewSentinel("the secrets store denied the operator's request", errclass.ClassConfiguration, "SecretStoreDenied")
	// ErrInvalidID: the SPIFFE ID is not a HyperFleet VM's
	// (spiffe://<trust domain>/vm/<namespace>/<claim>/<uid>).
	ErrInvalidID = errclass.NewSentinel("not a HyperFleet VM's SPIFFE ID", errclass.ClassPermanent, "InvalidSPIFFEID")
)

var (
	// namespaceRE is a Kubernetes namespace (a DNS label).
	namespaceRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	// claimRE is a Kubernetes object name (a DNS subdomain).
	claimRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`)
	// uidRE is a Kubernetes UID; also a valid Vault role name, which the
	// Vault back-end names each VM's login role after.
	uidRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,62}[a-z0-9])?$`)
)

// VM is what a HyperFleet VM's SPIFFE ID says: the claim it serves and its
// UID.
type VM struct {
	TrustDomain spiffeid.TrustDomain
	Namespace   string
	Claim       string
	UID         string
}

// ParseVMID checks that id is spiffe://<trust domain>/vm/<namespace>/<claim>/<uid>
// with each part a valid Kubernetes name, and returns the parts.
func ParseVMID(id spiffeid.ID) (VM, error) {
	segs := strings.Split(strings.TrimPrefix(id.Path(), "/"), "/")
	if id.IsZero() || len(segs) != 4 || segs[0] != "vm" {
		return VM{}, fmt.Errorf("%q: %w (spiffe://<trust domain>/vm/<namespace>/<claim>/<uid>)", id, ErrInvalidID)
	}
	vm := VM{TrustDomain: id.TrustDomain(), Namespace: segs[1], Claim: segs[2], UID: segs[3]}
	switch {
	case !namespaceRE.MatchString(vm.Namespace):
		return VM{}, fmt.Errorf("%q: %w: namespace %q is not a DNS label", id, ErrInvalidID, vm.Namespace)
	case !claimRE.MatchString(vm.Claim):
		return VM{}, fmt.Errorf("%q: %w: claim %q is not a DNS subdomain", id, ErrInvalidID, vm.Claim)
	case !uidRE.MatchString(vm.UID):
		return VM{}, fmt.Errorf("%q: %w: uid %q is not a Kubernetes UID (lower-case letters, digits, '-')", id, ErrInvalidID, vm.UID)
	}
	return vm, nil
}

// ID is the VM's SPIFFE ID.
func (vm VM) ID() spiffeid.ID {
	id, err := spiffeid.FromSegments(vm.TrustDomain, "vm", vm.Namespace, vm.Claim, vm.UID)
	if err != nil {
		// Only a VM that did not come from ParseVMID can get here.
		panic(fmt.Sprintf("secretstore: VM %+v has no valid SPIFFE ID: %v", vm, err))
	}
	return id
}

// Path is where the credential for id is stored under prefix:
// <prefix>/<trust domain>/vm/<namespace>/<claim>/<uid>. It is derived from
// the SPIFFE ID alone, which the operator computed, so no name a user
// chose can point it elsewhere; prefix must be a relative path of plain
// segments (agentconfig.CheckStorePath).
func Path(prefix string, id spiffeid.ID) (string, error) {
	if why := agentconfig.CheckStorePath(prefix); why != "" {
		return "", fmt.Errorf("secret store path prefix %q %s", prefix, why)
	}
	vm, err := ParseVMID(id)
	if err != nil {
		return "", err
	}
	return prefix + "/" + vm.TrustDomain.Name() + "/vm/" + vm.Namespace + "/" + vm.Claim + "/" + vm.UID, nil
}

// IDFromPath is Path's inverse: the SPIFFE ID whose credential is stored at
// p under prefix.
func IDFromPath(prefix, p string) (spiffeid.ID, error) {
	rest, ok := strings.CutPrefix(p, prefix+"/")
	if !ok {
		return spiffeid.ID{}, fmt.Errorf("path %q is not under %q", p, prefix)
	}
	td, idPath, ok := strings.Cut(rest, "/")
	if !ok {
		return spiffeid.ID{}, fmt.Errorf("path %q has no trust domain", p)
	}
	id, err := spiffeid.FromString("spiffe://" + td + "/" + idPath)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("path %q: %w", p, err)
	}
	if _, err := ParseVMID(id); err != nil {
		return spiffeid.ID{}, err
	}
	return id, nil
}
