package why

import (
	"fmt"
	"io"
	"text/tabwriter"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// WriteText prints the report: one line per link of the chain, then the
// blocker (reason, object and field, message, fix, entry) or the verdict.
func (r Report) WriteText(out io.Writer) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, l := range r.Chain {
		fmt.Fprintf(tw, "%s %s\t%s\n", l.Kind, l.Name, l.State)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing the chain: %w", err)
	}
	var err error
	if b := r.Blocked; b != nil {
		_, err = fmt.Fprintf(out, "BLOCKED %s: %s, %s\n  %s\n  fix: %s\n  see: %s\n", b.Reason, b.Object, b.Field, b.Message, b.Fix, b.Doc)
	} else {
		_, err = fmt.Fprintf(out, "NOT BLOCKED: %s\n", r.Verdict)
	}
	return err
}

// PoolStatus is one RunnerPool at a glance.
type PoolStatus struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Ready     int32  `json:"ready"`
	Min       int32  `json:"min"`
	Max       int32  `json:"max"`
	Desired   int32  `json:"desired"`
	Busy      int32  `json:"busy"`
	Queued    int32  `json:"queued"`
	// Reason is the Ready condition's reason, and CapacityAvailable's
	// when it is False.
	Reason string `json:"reason"`
}

// ClusterStatus is one HypervisorCluster at a glance.
type ClusterStatus struct {
	Name      string `json:"name"`
	Connected string `json:"connected"`
	Nodes     int32  `json:"nodes"`
	NodesSeen int    `json:"nodesSeen"`
	// Reason is the Ready condition's reason.
	Reason string `json:"reason"`
}

// Status is `hyperfleet status`: pools and clusters at a glance.
type Status struct {
	Pools    []PoolStatus    `json:"pools"`
	Clusters []ClusterStatus `json:"clusters"`
}

// Summarize reads w's pools and clusters.
func Summarize(w *World) Status {
	s := Status{Pools: []PoolStatus{}, Clusters: []ClusterStatus{}}
	for i := range w.Pools {
		p := &w.Pools[i]
		reason := condReason(p.Status.Conditions, hfv1.ReadyCondition)
		if c := falseCond(p.Status.Conditions, hfv1.RunnerPoolCapacityCondition); c != nil {
			reason += "/" + c.Reason
		}
		s.Pools = append(s.Pools, PoolStatus{Namespace: p.Namespace, Name: p.Name, Ready: p.Status.ReadyReplicas,
			Min: p.Spec.Scaling.MinReplicas, Max: p.Spec.Scaling.MaxReplicas, Desired: p.Status.DesiredReplicas,
			Busy: p.Status.BusyReplicas, Queued: p.Status.PendingJobs, Reason: reason})
	}
	for i := range w.Clusters {
		c := &w.Clusters[i]
		connected := "Unknown"
		if cond := hfv1.FindCondition(c.Status.Conditions, hfv1.HypervisorClusterConnectedCondition); cond != nil {
			connected = string(cond.Status)
		}
		s.Clusters = append(s.Clusters, ClusterStatus{Name: c.Name, Connected: connected, Nodes: c.Status.ConnectedNodes,
			NodesSeen: len(c.Status.Nodes), Reason: condReason(c.Status.Conditions, hfv1.ReadyCondition)})
	}
	return s
}

func condReason(conds []metav1.Condition, t hfv1.ConditionType) string {
	if c := hfv1.FindCondition(conds, t); c != nil {
		return c.Reason
	}
	return "-"
}

// WriteText prints the two tables.
func (s Status) WriteText(out io.Writer) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tRUNNERPOOL\tREADY\tMIN\tMAX\tDESIRED\tBUSY\tQUEUED\tREASON")
	for _, p := range s.Pools {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", p.Namespace, p.Name, p.Ready, p.Min, p.Max, p.Desired, p.Busy, p.Queued, p.Reason)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "HYPERVISORCLUSTER\tCONNECTED\tNODES\tREASON")
	for _, c := range s.Clusters {
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s\n", c.Name, c.Connected, c.Nodes, c.NodesSeen, c.Reason)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing the status: %w", err)
	}
	return nil
}
