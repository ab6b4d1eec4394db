package why

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/webhook"
)

// Load reads the World from the API server: the HyperFleet objects of
// namespace ("" for every namespace), every HypervisorCluster, and the
// routing events about jobs (the only record of a job no pool took). It
// lists with r, so the caller needs list on those kinds and on events.
func Load(ctx context.Context, r client.Reader, namespace string, now time.Time) (*World, error) {
	w := &World{Now: now}
	var opts []client.ListOption
	if namespace != "" {
		opts = append(opts, client.InNamespace(namespace))
	}
	var (
		jobs      hfv1.CIJobList
		pools     hfv1.RunnerPoolList
		claims    hfv1.MachineClaimList
		templates hfv1.HypervisorMachineTemplateList
		clusters  hfv1.HypervisorClusterList
	)
	for _, l := range []struct {
		what string
		list client.ObjectList
		opts []client.ListOption
	}{
		{"CIJobs", &jobs, opts}, {"RunnerPools", &pools, opts}, {"MachineClaims", &claims, opts},
		{"HypervisorMachineTemplates", &templates, opts}, {"HypervisorClusters", &clusters, nil},
	} {
		if err := r.List(ctx, l.list, l.opts...); err != nil {
			return nil, fmt.Errorf("listing %s: %w", l.what, err)
		}
	}
	w.Jobs, w.Pools, w.Claims, w.Templates, w.Clusters = jobs.Items, pools.Items, claims.Items, templates.Items, clusters.Items
	for _, reason := range []string{webhook.ReasonNoMatchingRunnerPool, string(hfv1.AmbiguousJobRoutingReason)} {
		var evs corev1.EventList
		// The API server selects events by reason (a field selector), so
		// a namespace's other events are not read.
		if err := r.List(ctx, &evs, append([]client.ListOption{client.MatchingFields{"reason": reason}}, opts...)...); err != nil {
			return nil, fmt.Errorf("listing the events %s: %w", reason, err)
		}
		w.Events = append(w.Events, evs.Items...)
	}
	return w, nil
}
