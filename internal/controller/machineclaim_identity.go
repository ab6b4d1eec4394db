package controller

import (
	"context"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/claimstatus"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
)

// A claim whose template attests with SPIRE (spec.attestation.method
// join-token) gets its identity in three steps, each recorded in
// status.identity before the next is taken (docs/identity.md):
// ensureIdentity plans the ids, then creates the join token and the
// registration entry before the VM is built; watchAttestation waits for
// the VM's spire-agent to attest, failing the claim at the cluster's
// deadline; releaseIdentity deletes the entries and the agent when the VM
// is gone.

const (
	// attestationRecheck is how often a VM whose agent has not attested
	// yet is looked up on the SPIRE server.
	attestationRecheck = 3 * time.Second
	// defaultJoinTokenTTL and defaultAttestationDeadline are the API's
	// defaults, for objects written before the defaults existed.
	defaultJoinTokenTTL        = 15 * time.Minute
	defaultAttestationDeadline = 10 * time.Minute
)

// attests reports whether the template's VMs attest with SPIRE join
// tokens.
func attests(tmpl *hfv1.HypervisorMachineTemplate) bool {
	return tmpl.Spec.Attestation.Method == hfv1.AttestationJoinToken
}

// ensureIdentity issues the claim's identity before its VM is built.
func (r *MachineClaimReconciler) ensureIdentity(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	claim := s.claim
	st := claim.Status.Identity
	if !attests(s.tmpl) || claim.Status.VMRef != nil || st != nil && st.JoinTokenCreatedAt != nil {
		return ctrl.Result{}, true, nil
	}
	srv, err := r.spireServer(ctx, s.cluster)
	if err != nil {
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.SPIREUnavailableReason,
			"New VMs wait for the SPIRE server: "+err.Error())
		// A wait, reported in the condition, not a failed reconcile.
		return ctrl.Result{RequeueAfter: r.backoff(claim)}, false, nil //nolint:nilerr // the condition carries the error; the backoff paces the retries
	}
	if st == nil {
		plan, err := identity.Plan(srv, claim)
		if err != nil {
			res, err := r.provisionError(ctx, s, err)
			return res, false, err
		}
		// Recorded first: whatever is created on the SPIRE server from
		// here on is found again, and removed, through these ids.
		claim.Status.Identity = plan
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimAttestedCondition, metav1.ConditionFalse, hfv1.AttestationPendingReason,
			"The VM's SPIFFE ID is "+plan.SPIFFEID+"; its join token is not issued yet")
		return ctrl.Result{RequeueAfter: time.Millisecond}, false, nil
	}
	ttl := defaultJoinTokenTTL
	if jt := s.tmpl.Spec.Attestation.JoinToken; jt != nil && jt.TTL != nil {
		ttl = jt.TTL.Duration
	}
	expires, err := r.Issuer.Issue(ctx, srv, claim, ttl)
	if c := errclass.Classify(err); err != nil && (c == errclass.ClassPermanent || c == errclass.ClassConfiguration) {
		// Not the server being away: an entry of ours taken by another
		// identity, or a refused request. Said with the client's reason.
		res, err := r.provisionError(ctx, s, fmt.Errorf("issue the VM's identity: %w", err))
		return res, false, err
	}
	if err != nil {
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.SPIREUnavailableReason,
			"Could not issue the VM's identity: "+err.Error())
		ctrl.LoggerFrom(ctx).Info("Issuing the VM's identity failed", "err", err.Error())
		return ctrl.Result{RequeueAfter: r.backoff(claim)}, false, nil
	}
	now := metav1.NewTime(r.Clock.Now())
	st.JoinTokenCreatedAt, st.JoinTokenExpiresAt = &now, &metav1.Time{Time: expires}
	r.Recorder.Eventf(claim, corev1.EventTypeNormal, "IdentityIssued", "Join token (valid until %s) and registration entry %s issued for %s",
		expires.UTC().Format(time.RFC3339), st.EntryID, st.SPIFFEID)
	// Stored before the VM's cloud-init is rendered with the token.
	return ctrl.Result{RequeueAfter: time.Millisecond}, false, nil
}

// watchAttestation checks whether a running VM's agent attested; one that
// has not by the cluster's deadline, or whose token expired unused, fails
// the claim (a used or expired token makes spire-agent retry forever).
func (r *MachineClaimReconciler) watchAttestation(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	claim := s.claim
	st := claim.Status.Identity
	provisioned := hfv1.FindCondition(claim.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
	if st == nil || st.AttestedAt != nil || st.JoinTokenCreatedAt == nil || provisioned == nil || provisioned.Status != metav1.ConditionTrue {
		return ctrl.Result{}, true, nil
	}
	srv, err := r.spireServer(ctx, s.cluster)
	if err == nil {
		var attested bool
		if attested, err = r.Issuer.Attested(ctx, srv, claim); err == nil && attested {
			st.AttestedAt = &metav1.Time{Time: r.Clock.Now()}
			setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimAttestedCondition, metav1.ConditionTrue, hfv1.AttestedReason,
				"The VM's spire-agent attested as "+st.NodeID)
			r.Recorder.Eventf(claim, corev1.EventTypeNormal, string(hfv1.AttestedReason), "The VM's spire-agent attested; its SPIFFE ID is %s", st.SPIFFEID)
			return ctrl.Result{}, true, nil
		}
	}
	now := r.Clock.Now()
	deadline := provisioned.LastTransitionTime.Add(attestationDeadline(s.cluster))
	why := fmt.Sprintf("the VM's spire-agent did not attest within spec.spire.attestationDeadline (%s) of HypervisorCluster %s", attestationDeadline(s.cluster), s.cluster.Name)
	if exp := st.JoinTokenExpiresAt; exp != nil && exp.Before(&metav1.Time{Time: deadline}) {
		deadline = exp.Time
		why = fmt.Sprintf("the VM's join token expired at %s before its spire-agent attested (spec.attestation.joinToken.ttl is shorter than cloning and booting take)", exp.UTC().Format(time.RFC3339))
	}
	if !now.Before(deadline) {
		r.fail(claim, claimEnd{reason: hfv1.EndFailed, condition: hfv1.AttestationFailedReason,
			message: why + "; the claim fails and its VM is destroyed. The agent's log in the VM's console says why (a reused or expired join token, or no route to the SPIRE server at spec.spire.serverAddress)"})
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimAttestedCondition, metav1.ConditionFalse, hfv1.AttestationFailedReason, why)
		r.Recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.AttestationFailedReason), why)
		res, _, err := r.reconcileFailed(ctx, s)
		return res, false, err
	}
	msg := fmt.Sprintf("Waiting for the VM's spire-agent to attest (deadline %s)", deadline.UTC().Format(time.RFC3339))
	if err != nil {
		msg += "; the SPIRE server could not be asked: " + err.Error()
	}
	setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimAttestedCondition, metav1.ConditionFalse, hfv1.AttestationPendingReason, msg)
	s.recheck(min(attestationRecheck, deadline.Sub(now)+time.Millisecond))
	return ctrl.Result{}, true, nil
}

// releaseIdentity deletes the VM's entries and agent from the SPIRE
// server once its VM is gone; done is false while the server cannot be
// reached (the claim keeps its finalizer until then).
func (r *MachineClaimReconciler) releaseIdentity(ctx context.Context, claim *hfv1.MachineClaim) (bool, ctrl.Result) {
	st := claim.Status.Identity
	if st == nil || st.ReleasedAt != nil || r.Issuer == nil {
		return true, ctrl.Result{}
	}
	id, err := spiffeid.FromString(st.SPIFFEID)
	if err != nil {
		// Not an id this operator wrote; nothing of it can be on a server.
		return true, ctrl.Result{}
	}
	srv, ok := r.Identity.ByTrustDomain(id.TrustDomain())
	if !ok {
		claimstatus.SetEnding(claim, hfv1.SPIREUnavailableReason, fmt.Sprintf("Waiting for the SPIRE server of trust domain %s to delete the VM's entry %s", id.TrustDomain(), st.EntryID))
		return false, ctrl.Result{RequeueAfter: r.backoff(claim)}
	}
	if done, res := r.forgetStoredCredential(ctx, claim, srv.Cluster); !done {
		return false, res
	}
	if err := r.Issuer.Release(ctx, srv, claim); err != nil {
		claimstatus.SetEnding(claim, hfv1.SPIREUnavailableReason, "Could not delete the VM's SPIRE entries yet: "+err.Error())
		return false, ctrl.Result{RequeueAfter: r.backoff(claim)}
	}
	st.ReleasedAt = &metav1.Time{Time: r.Clock.Now()}
	r.Recorder.Eventf(claim, corev1.EventTypeNormal, "IdentityReleased", "Deleted SPIRE entry %s, the agent alias %s and the agent", st.EntryID, st.NodeID)
	return true, ctrl.Result{}
}

// releaseIdentityPhase releases a deleted claim's identity once its VM is
// gone.
func (r *MachineClaimReconciler) releaseIdentityPhase(ctx context.Context, s *claimScope) (ctrl.Result, bool, error) {
	done, result := r.releaseIdentity(ctx, s.claim)
	return result, done, nil
}

// spireServer is the cluster's SPIRE server, connected on demand (the
// HypervisorCluster controller keeps it current and reports it).
func (r *MachineClaimReconciler) spireServer(ctx context.Context, cluster *hfv1.HypervisorCluster) (*identity.Server, error) {
	cfg := cluster.Spec.SPIRE
	if cfg == nil {
		return nil, fmt.Errorf("HypervisorCluster %s has no spec.spire", cluster.Name)
	}
	if r.Identity == nil || r.Issuer == nil {
		return nil, fmt.Errorf("this operator was started without SPIRE support")
	}
	return r.Identity.Connect(ctx, cluster.Name, *cfg)
}

// setIdentityVars fills in what the VM's agent needs to attest and fetch
// its credential: the join token (derived again, never stored), the trust
// bundle, the SPIRE server, and the broker or the secrets store.
func (r *MachineClaimReconciler) setIdentityVars(ctx context.Context, claim *hfv1.MachineClaim, cluster *hfv1.HypervisorCluster, v *cloudinit.Vars) error {
	st := claim.Status.Identity
	if st == nil || st.JoinTokenCreatedAt == nil {
		return fmt.Errorf("the claim's identity is not issued yet")
	}
	srv, err := r.spireServer(ctx, cluster)
	if err != nil {
		return err
	}
	token, err := r.Issuer.Token(claim)
	if err != nil {
		return err
	}
	_, pem := srv.Bundle()
	v.SPIFFEID, v.TrustDomain, v.JoinToken, v.TrustBundle = st.SPIFFEID, srv.TrustDomain.Name(), token, pem
	v.SPIREServerAddress = cluster.Spec.SPIRE.ServerAddress
	if cfg := secretStoreOf(cluster); cfg != nil {
		// The VM reads its credential from the store: no broker address.
		store, err := identity.StoreAgentConfig(ctx, cfg, st.SPIFFEID, r.readClusterSecret)
		if err != nil {
			return err
		}
		v.SecretStore, v.BrokerURL, v.BrokerCA = store, "", ""
		v.SecretStoreRole, v.SecretStorePath, v.SecretStoreCA = store.Role, store.Path, store.CABundle
	} else {
		if r.Broker == nil {
			return fmt.Errorf("this operator runs no credential broker: start the manager with the agent server (--agent-server-addr, --agent-server-url, --agent-server-cert, --agent-server-key)")
		}
		v.BrokerURL, v.BrokerCA = r.Broker.URL(), r.Broker.CA()
	}
	if exp := st.JoinTokenExpiresAt; exp != nil {
		v.ExpiresAt = cloudinit.Time{Time: exp.Time}
	}
	return nil
}

// attestationDeadline is the cluster's spec.spire.attestationDeadline.
func attestationDeadline(cluster *hfv1.HypervisorCluster) time.Duration {
	if c := cluster.Spec.SPIRE; c != nil && c.AttestationDeadline != nil {
		return c.AttestationDeadline.Duration
	}
	return defaultAttestationDeadline
}

// Join-token lifetimes a cluster allows when its spec.spire.joinTokenTTL
// leaves a bound out.
const (
	defaultMinJoinTokenTTL = time.Minute
	defaultMaxJoinTokenTTL = time.Hour
)

// checkIdentity says why a template that attests with SPIRE cannot be used
// on cluster, or returns an empty reason.
func (r *HypervisorMachineTemplateReconciler) checkIdentity(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster) (hfv1.ConditionReason, string) {
	if !attests(tmpl) {
		return "", ""
	}
	cfg := cluster.Spec.SPIRE
	if cfg == nil {
		return hfv1.SPIRENotConfiguredReason, fmt.Sprintf("spec.attestation.method is join-token, but HypervisorCluster %s has no spec.spire: ask its owner to connect it to a SPIRE server (docs/identity.md), or set spec.attestation.method none", cluster.Name)
	}
	ttl := defaultJoinTokenTTL
	if jt := tmpl.Spec.Attestation.JoinToken; jt != nil && jt.TTL != nil {
		ttl = jt.TTL.Duration
	}
	lo, hi := defaultMinJoinTokenTTL, defaultMaxJoinTokenTTL
	if b := cfg.JoinTokenTTL; b != nil {
		if b.Min != nil {
			lo = b.Min.Duration
		}
		if b.Max != nil {
			hi = b.Max.Duration
		}
	}
	if ttl < lo || ttl > hi {
		return hfv1.JoinTokenTTLNotAllowedReason, fmt.Sprintf("spec.attestation.joinToken.ttl %s is outside the join-token lifetimes HypervisorCluster %s allows (spec.spire.joinTokenTTL, %s to %s); choose a ttl within them",
			ttl, cluster.Name, lo, hi)
	}
	if r.Identity.Issuer == nil || cfg.SecretStore == nil && r.Identity.Broker == nil {
		return hfv1.BrokerUnavailableReason, "spec.attestation.method is join-token, but this operator runs no credential broker for the VMs to fetch their runner credential from: start the manager with the agent server (--agent-server-addr, --agent-server-url, --agent-server-cert and --agent-server-key; docs/identity.md), or set spec.attestation.method none"
	}
	if c := hfv1.FindCondition(cluster.Status.Conditions, hfv1.HypervisorClusterSPIREConnectedCondition); c == nil || c.Status != metav1.ConditionTrue {
		msg := "it has not been reached yet"
		if c != nil {
			msg = c.Message
		}
		return hfv1.SPIREUnavailableReason, fmt.Sprintf("the SPIRE server of HypervisorCluster %s (spec.spire) is not connected: %s", cluster.Name, msg)
	}
	return "", ""
}

// poweredOff is the end of a claim whose VM powered off. A VM that attests
// and powers off before its agent attested gave up on its join token (the
// agent exits with code 9 when SPIRE refuses it: used, expired, or the
// server unreachable until its deadline): the claim says so rather than
// only that the VM went off.
func (r *MachineClaimReconciler) poweredOff(claim *hfv1.MachineClaim, msg string) claimEnd {
	if st := claim.Status.Identity; st != nil && st.JoinTokenCreatedAt != nil && st.AttestedAt == nil {
		msg += " before its spire-agent attested: the VM's agent gave up on its join token (exit code 9: refused as used or expired, or the SPIRE server at spec.spire.serverAddress unreachable); its console says which"
		setCondition(&claim.Status.Conditions, claim.Generation, hfv1.MachineClaimAttestedCondition, metav1.ConditionFalse, hfv1.AttestationFailedReason, msg)
		r.Recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.AttestationFailedReason), msg)
		return claimEnd{reason: hfv1.EndPoweredOff, condition: hfv1.AttestationFailedReason, message: msg}
	}
	return claimEnd{reason: hfv1.EndPoweredOff, condition: hfv1.VMPoweredOffReason, message: msg}
}
