// The reservation service is what a MachineClaim stores in its annotations,
// signed, in its one write before its clone request (docs/architecture.md,
// "Never block in Reconcile"): the VM reservation (writing it, reading it,
// and deciding whether a claim may trust it again after the operator stopped
// between the clone request and the status write that records the VM) and
// the placement record (what the VM was authorized to be, which every later
// step builds the VM from; docs/security.md, "The placement record"). The
// signatures are pkg/ownership's.

package machineclaim

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/tenancy"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
)

// Reserved is a VMReservationAnnotation value as read: the reserved VM
// and the signature that must verify before it is trusted.
type Reserved struct {
	Ref *hfv1.VMReference
	Sig string
	// Legacy: written by a version before provider IDs as
	// "<cluster>/<node>/<vmid>/<r1 signature>" (the VM id then always a
	// Proxmox one); its signature is over the decimal id.
	Legacy bool
}

// Parse reads a VMReservationAnnotation value.
func Parse(v string) (Reserved, error) {
	parts := strings.SplitN(v, "/", 4)
	if len(parts) != 4 || parts[0] == "" || parts[2] == "" || parts[3] == "" {
		return Reserved{}, fmt.Errorf("%q is not <HypervisorCluster>/<node>/<signature>/<provider ID>", v)
	}
	cluster, node := parts[0], parts[1]
	if id, err := strconv.ParseInt(parts[2], 10, 32); err == nil && strings.HasPrefix(parts[3], "r1.") {
		if id < 100 || node == "" || strings.Contains(parts[3], "/") {
			return Reserved{}, fmt.Errorf("%q is not <HypervisorCluster>/<node>/<vmid>/<signature>", v)
		}
		return Reserved{Ref: &hfv1.VMReference{HypervisorCluster: cluster, Node: node, VMID: int32(id)}, Sig: parts[3], Legacy: true}, nil
	}
	return Reserved{Ref: hfv1.NewVMReference(cluster, parts[3], node), Sig: parts[2]}, nil
}

// reservation is what the signature of r covers.
func (r Reserved) reservation(claim *hfv1.MachineClaim) ownership.Reservation {
	res := ownership.Reservation{ClaimUID: string(claim.UID), Cluster: r.Ref.HypervisorCluster, Node: r.Ref.Node, VM: r.Ref.ProviderID}
	if r.Legacy {
		res.VM = strconv.Itoa(int(r.Ref.VMID))
	}
	return res
}

// reservationRefusal is why a reservation annotation is not trusted.
type reservationRefusal struct{ reason string }

func (e *reservationRefusal) Error() string { return e.reason }

func refuse(format string, args ...any) error {
	return &reservationRefusal{reason: fmt.Sprintf(format, args...)}
}

// reservations are the VM reservations and placement records the claim
// controller signs into claims, and their verification: a claim's VM is
// only ever restored, built or destroyed from a record whose signature
// verifies for the claim.
type reservations struct {
	signer   *ownership.Signer
	registry *hypervisors.Registry
	client   client.Client
	recorder record.EventRecorder
}

// reservations are the claims' reservations, signed with the
// reconciler's Signer.
func (r *Reconciler) reservations() reservations {
	return reservations{signer: r.Signer, registry: r.Registry, client: r.Client, recorder: r.Recorder}
}

// restore puts a reserved VM back into a claim's status when the
// operator stopped after its clone request and before the status write
// that records the VM: the claim then continues that clone (or deletes
// that VM) instead of placing a second one. It only applies to claims that
// have not yet recorded a VM of their own.
//
// The annotation is the one claim field a tenant could use to point the
// operator at a VM, so it is trusted only when its signature verifies for
// this claim's UID AND the VM it names is one placement could have chosen
// for the claim: the template's cluster, a namespace that cluster admits,
// a VM id in its range and an allowed node. Anything else is refused with
// a warning event and the claim is placed as if it had no reservation.
// An error means the check could not be made (a read failed): the caller
// retries instead of placing a second VM.
func (rv reservations) restore(ctx context.Context, s *claimScope) error {
	claim := s.claim
	v, ok := claim.Annotations[hfv1.VMReservationAnnotation]
	if !ok || claim.Status.VMRef != nil || claim.Ended() || s.facts.isTrue(claim, hfv1.MachineClaimProvisionedCondition) {
		return nil
	}
	reserved, err := Parse(v)
	ref := reserved.Ref
	if err == nil {
		err = rv.verify(ctx, claim, reserved)
	}
	var refused *reservationRefusal
	switch {
	case errors.As(err, &refused):
		rv.reject(ctx, claim, refused.reason)
		return nil
	case errors.Is(err, errReservationWait):
		return nil
	case err != nil && ref == nil:
		// Unreadable: nothing the operator wrote.
		rv.reject(ctx, claim, err.Error())
		return nil
	case err != nil:
		return fmt.Errorf("check the VM reservation in annotation %s: %w", hfv1.VMReservationAnnotation, err)
	}
	ctrl.LoggerFrom(ctx).Info("Continuing with the VM reserved before the last clone request", "cluster", ref.HypervisorCluster, "node", ref.Node, "vm", ref.ID())
	claim.Status.VMRef = hfv1.NewVMReference(ref.HypervisorCluster, ref.ID(), ref.Node)
	return nil
}

// errReservationWait: the reservation cannot be checked yet (its template
// is missing); the claim waits for the template without placing a VM.
var errReservationWait = errors.New("reservation cannot be checked yet")

// verify checks the signature, then that placement could have
// chosen the reserved VM for this claim.
func (rv reservations) verify(ctx context.Context, claim *hfv1.MachineClaim, reserved Reserved) error {
	ref := reserved.Ref
	verify := rv.signer.VerifyReservation
	if reserved.Legacy {
		verify = rv.signer.VerifyLegacyReservation
	}
	if rv.signer == nil || !verify(reserved.reservation(claim), reserved.Sig) {
		return refuse("its signature does not verify for this claim (written by someone other than this operator, edited, or copied from another claim)")
	}
	deleting := !claim.DeletionTimestamp.IsZero()
	tmpl := &hfv1.HypervisorMachineTemplate{}
	switch err := rv.client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: claim.Spec.TemplateRef.Name}, tmpl); {
	case apierrors.IsNotFound(err) && !deleting:
		return errReservationWait
	case apierrors.IsNotFound(err):
		// Deleting: the signature is the operator's word; the VM itself is
		// only destroyed if its ownership marker verifies for this claim.
	case err != nil:
		return fmt.Errorf("read HypervisorMachineTemplate %s: %w", claim.Spec.TemplateRef.Name, err)
	case tmpl.Spec.HypervisorClusterRef.Name != ref.HypervisorCluster:
		return refuse("it names HypervisorCluster %s but template %s uses %s", ref.HypervisorCluster, tmpl.Name, tmpl.Spec.HypervisorClusterRef.Name)
	}
	cluster := &hfv1.HypervisorCluster{}
	if err := rv.client.Get(ctx, client.ObjectKey{Name: ref.HypervisorCluster}, cluster); err != nil {
		return fmt.Errorf("read HypervisorCluster %s: %w", ref.HypervisorCluster, err)
	}
	if !deleting {
		_, admitted, err := tenancy.RulesFor(ctx, rv.client, cluster, claim.Namespace)
		if err != nil {
			return err
		}
		if !admitted {
			return refuse("HypervisorCluster %s does not admit namespace %s", cluster.Name, claim.Namespace)
		}
	}
	// The provider knows its ids: whether this one is of its scheme, in
	// the cluster's range, on a node placement may use. A cluster not
	// connected yet cannot say: retry rather than place a second VM (or,
	// when deleting, forget the reserved one).
	p, health, connected := rv.registry.Provider(cluster.Name)
	if !connected {
		return fmt.Errorf("HypervisorCluster %s is not connected (%s); the reservation is checked once it is", cluster.Name, health.Message)
	}
	if err := p.CheckRef(vmRefOf(ref)); err != nil {
		return refuse("HypervisorCluster %s could not have placed VM %s: %v", cluster.Name, ref.ID(), err)
	}
	return nil
}

// reject reports a reservation annotation that is not trusted.
func (rv reservations) reject(ctx context.Context, claim *hfv1.MachineClaim, reason string) {
	msg := fmt.Sprintf("Ignoring annotation %s: %s; the claim is placed as if it had none", hfv1.VMReservationAnnotation, reason)
	ctrl.LoggerFrom(ctx).Info("Refused a VM reservation annotation", "reason", reason)
	metrics.ReservationsRejected.Inc()
	rv.recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.ReservationRejectedReason), conditions.Truncate(msg, 1024))
}
