package devenv

import (
	"context"
	"fmt"
	"net"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// ClusterSpec is one more Proxmox VE cluster for the world, beside the
// one Start creates (ClusterName): its own simulator, configured like the
// first one, and its own HypervisorCluster.
type ClusterSpec struct {
	// Name is the HypervisorCluster's name.
	Name string
	// Listener serves its API; nil listens on a loopback port. A listener
	// in a network namespace lets a test cut the manager off from it.
	Listener net.Listener
	// Configure changes the simulator's configuration (nodes, storages,
	// templates) before it starts.
	Configure func(*proxmoxsim.Config)
	// VMIDs is the range its VMs take ids from (spec.proxmox.vmidRange);
	// zero: 1000-1999, as the first cluster's.
	VMIDs hfv1.VMIDRange
}

// Cluster is a Proxmox VE cluster AddCluster made.
type Cluster struct {
	Name string
	// Sim is its simulator, URL its API's base URL (as the
	// HypervisorCluster's endpoint).
	Sim *proxmoxsim.Simulator
	URL string
}

// AddCluster starts another simulated Proxmox VE cluster and creates its
// HypervisorCluster, a copy of the first one's (credentials, SPIRE
// settings, poll interval) with its own endpoint, certificate pin and VM
// id range. The simulator stops with the world.
func (w *World) AddCluster(ctx context.Context, spec ClusterSpec) (*Cluster, error) {
	cfg, err := w.simConfig()
	if err != nil {
		return nil, err
	}
	if spec.Configure != nil {
		spec.Configure(&cfg)
	}
	sim, err := proxmoxsim.New(cfg, proxmoxsim.WithAdmin(w.opts.SimulatorAdmin), proxmoxsim.WithLogger(w.simLogger("proxmox-sim-"+spec.Name)))
	if err != nil {
		return nil, fmt.Errorf("devenv: Proxmox simulator %s: %w", spec.Name, err)
	}
	w.mu.Lock()
	w.clusters = append(w.clusters, sim)
	w.mu.Unlock()
	ln := spec.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("devenv: listen: %w", err)
		}
	}
	apiURL, fingerprint, err := w.serveProxmox(sim, ln)
	if err != nil {
		return nil, err
	}
	objs, err := w.Objects()
	if err != nil {
		return nil, err
	}
	cluster := objectOf[*hfv1.HypervisorCluster](objs).DeepCopy()
	cluster.ObjectMeta = metav1.ObjectMeta{Name: spec.Name}
	cluster.Spec.Endpoint = apiURL
	cluster.Spec.TLS = &hfv1.HypervisorTLS{FingerprintSHA256: fingerprint}
	if spec.VMIDs != (hfv1.VMIDRange{}) {
		cluster.Spec.Proxmox = &hfv1.ProxmoxClusterSettings{VMIDRange: &spec.VMIDs}
	}
	if err := w.API.Client.Create(ctx, cluster); err != nil {
		return nil, fmt.Errorf("devenv: create HypervisorCluster %s: %w", spec.Name, err)
	}
	return &Cluster{Name: spec.Name, Sim: sim, URL: apiURL}, nil
}

// PoolSpec is one more RunnerPool for the world, in Namespace, with a
// template of its own on a cluster of the world.
type PoolSpec struct {
	// Name names the RunnerPool and its HypervisorMachineTemplate.
	Name string
	// Cluster is the HypervisorCluster its VMs run on.
	Cluster string
	// Label is the job label its runners take (besides self-hosted).
	Label string
	// MinReplicas and MaxReplicas bound it.
	MinReplicas, MaxReplicas int32
	// IPPool, when set, gives its VMs static addresses from an IPPool of
	// the pool's name.
	IPPool *hfv1.IPPoolSpec
	// Attest keeps the world's attestation (Options.SPIFFE) on the pool's
	// template; without it the template attests nothing.
	Attest bool
	// ScaleSet, when set, is the runner scale set the pool listens to
	// (spec.workload.github.scaleSet), in the organization's Default
	// runner group.
	ScaleSet string
	// OverflowCluster, when set, gives the pool a second template,
	// <Name>-overflow, a copy of its own on that cluster, in
	// spec.placement (strategy pack): the pool's VMs spill there when
	// Cluster cannot take them.
	OverflowCluster string
}

// OverflowTemplate is the name of the overflow template AddPool makes for
// a pool with PoolSpec.OverflowCluster.
func OverflowTemplate(pool string) string { return pool + "-overflow" }

// AddPool creates a RunnerPool and its template, copies of the world's
// (bootstrap, cloud-init, attestation, resources) on spec.Cluster, taking
// jobs labelled spec.Label; and its IPPool if it has one.
func (w *World) AddPool(ctx context.Context, spec PoolSpec) error {
	objs, err := w.Objects()
	if err != nil {
		return err
	}
	tmpl := objectOf[*hfv1.HypervisorMachineTemplate](objs).DeepCopy()
	tmpl.ObjectMeta = metav1.ObjectMeta{Namespace: Namespace, Name: spec.Name}
	tmpl.Spec.HypervisorClusterRef = hfv1.ObjectName{Name: spec.Cluster}
	if !spec.Attest {
		tmpl.Spec.Attestation = hfv1.Attestation{Method: hfv1.AttestationNone}
	}
	created := []client.Object{}
	if spec.IPPool != nil {
		created = append(created, &hfv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: spec.Name}, Spec: *spec.IPPool.DeepCopy()})
		tmpl.Spec.Network = hfv1.MachineNetwork{Mode: hfv1.NetworkModeStatic, IPPoolRef: &hfv1.ObjectName{Name: spec.Name}}
	} else if w.opts.IPPool != nil {
		tmpl.Spec.Network = hfv1.MachineNetwork{}
	}
	pool := objectOf[*hfv1.RunnerPool](objs).DeepCopy()
	pool.ObjectMeta = metav1.ObjectMeta{Namespace: Namespace, Name: spec.Name}
	pool.Spec.TemplateRef = hfv1.ObjectName{Name: spec.Name}
	pool.Spec.Workload.GitHub.Labels = []string{spec.Label}
	pool.Spec.Scaling.MinReplicas, pool.Spec.Scaling.MaxReplicas = spec.MinReplicas, spec.MaxReplicas
	if spec.ScaleSet != "" {
		pool.Spec.Workload.GitHub.ScaleSet = &hfv1.GitHubScaleSet{Name: spec.ScaleSet}
	}
	created = append(created, tmpl, pool)
	if spec.OverflowCluster != "" {
		over := tmpl.DeepCopy()
		over.Name = OverflowTemplate(spec.Name)
		over.Spec.HypervisorClusterRef = hfv1.ObjectName{Name: spec.OverflowCluster}
		pool.Spec.Placement = &hfv1.PoolPlacement{Strategy: hfv1.PlacementPack, Templates: []hfv1.ObjectName{{Name: over.Name}}}
		created = append(created, over)
	}
	for _, o := range created {
		if err := w.API.Client.Create(ctx, o); err != nil {
			return fmt.Errorf("devenv: create %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

// EnqueueJobsFor queues n jobs labelled label on the repository; each runs
// for d once a runner takes it. It returns their ids.
func (w *World) EnqueueJobsFor(label string, n int, d time.Duration) ([]int64, error) {
	ids := make([]int64, 0, n)
	for range n {
		j, err := w.GitHub.EnqueueJob(githubsim.JobRequest{Repository: Repository, Labels: []string{"self-hosted", label}, Duration: d})
		if err != nil {
			return ids, fmt.Errorf("devenv: enqueue job: %w", err)
		}
		ids = append(ids, j.ID)
	}
	w.mu.Lock()
	w.jobs = append(w.jobs, ids...)
	w.mu.Unlock()
	return ids, nil
}

// objectOf is the first object of type T in objs (the world's objects
// always hold one of each kind it copies).
func objectOf[T client.Object](objs []client.Object) T {
	for _, o := range objs {
		if t, ok := o.(T); ok {
			return t
		}
	}
	var zero T
	return zero
}

// GenericPoolSpec is a RunnerPool of workload type generic for the world
// (docs/generic.md), in Namespace, with a template of its own.
type GenericPoolSpec struct {
	// Name names the RunnerPool and its HypervisorMachineTemplate.
	Name string
	// Script is the template's spec.bootstrap.generic.script, TTL its ttl
	// (zero: the default, 1h).
	Script string
	TTL    time.Duration
	// MinReplicas is the pool's size (maxReplicas too).
	MinReplicas int32
	// Attest keeps the world's attestation (Options.SPIFFE) on the
	// template, so that the script gets SPIFFE_ENDPOINT_SOCKET.
	Attest bool
}

// AddGenericPool creates a generic RunnerPool and its template, a copy of
// the world's (cloud-init, resources, agent source, cluster) whose
// bootstrap is spec.Script instead of GitHub Actions.
func (w *World) AddGenericPool(ctx context.Context, spec GenericPoolSpec) error {
	objs, err := w.Objects()
	if err != nil {
		return err
	}
	tmpl := objectOf[*hfv1.HypervisorMachineTemplate](objs).DeepCopy()
	tmpl.ObjectMeta = metav1.ObjectMeta{Namespace: Namespace, Name: spec.Name}
	if !spec.Attest {
		tmpl.Spec.Attestation = hfv1.Attestation{Method: hfv1.AttestationNone}
	}
	generic := &hfv1.GenericBootstrap{Script: spec.Script}
	if spec.TTL > 0 {
		generic.TTL = &metav1.Duration{Duration: spec.TTL}
	}
	tmpl.Spec.Bootstrap = hfv1.Bootstrap{AgentSource: tmpl.Spec.Bootstrap.AgentSource, Generic: generic}
	pool := &hfv1.RunnerPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: spec.Name},
		Spec: hfv1.RunnerPoolSpec{
			TemplateRef: hfv1.ObjectName{Name: spec.Name},
			Workload:    hfv1.Workload{Type: hfv1.WorkloadGeneric},
			Scaling:     hfv1.Scaling{MinReplicas: spec.MinReplicas, MaxReplicas: max(spec.MinReplicas, 1)},
		},
	}
	for _, o := range []client.Object{tmpl, pool} {
		if err := w.API.Client.Create(ctx, o); err != nil {
			return fmt.Errorf("devenv: create %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}
