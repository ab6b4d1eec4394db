package controller

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

var claimsDesc = prometheus.NewDesc("hyperfleet_machineclaims", "MachineClaims by phase, from the operator's cache.", []string{"phase"}, nil)

// ClaimPhaseCollector counts claims by phase at scrape time from the cache,
// so the gauge is right after restarts without bookkeeping.
type ClaimPhaseCollector struct {
	reader client.Reader
}

// NewClaimPhaseCollector returns a collector; add it to the manager so it
// registers once the cache runs.
func NewClaimPhaseCollector(reader client.Reader) *ClaimPhaseCollector {
	return &ClaimPhaseCollector{reader: reader}
}

// Start registers the collector (manager.Runnable); it runs on every
// replica so each one's /metrics answers.
func (c *ClaimPhaseCollector) Start(ctx context.Context) error {
	if err := crmetrics.Registry.Register(c); err != nil {
		return err
	}
	<-ctx.Done()
	crmetrics.Registry.Unregister(c)
	return nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (c *ClaimPhaseCollector) NeedLeaderElection() bool { return false }

// Describe implements prometheus.Collector.
func (c *ClaimPhaseCollector) Describe(ch chan<- *prometheus.Desc) { ch <- claimsDesc }

// Collect implements prometheus.Collector.
func (c *ClaimPhaseCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var list hfv1.MachineClaimList
	if err := c.reader.List(ctx, &list); err != nil {
		ch <- prometheus.NewInvalidMetric(claimsDesc, err)
		return
	}
	counts := map[hfv1.MachineClaimPhase]int{}
	for _, p := range []hfv1.MachineClaimPhase{hfv1.MachineClaimPending, hfv1.MachineClaimProvisioning, hfv1.MachineClaimBootstrapping,
		hfv1.MachineClaimReady, hfv1.MachineClaimDraining, hfv1.MachineClaimTerminating, hfv1.MachineClaimFailed} {
		counts[p] = 0
	}
	for i := range list.Items {
		phase := list.Items[i].Status.Phase
		if phase == "" {
			phase = hfv1.MachineClaimPending
		}
		counts[phase]++
	}
	for phase, n := range counts {
		ch <- prometheus.MustNewConstMetric(claimsDesc, prometheus.GaugeValue, float64(n), string(phase))
	}
}
