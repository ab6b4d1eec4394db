package devenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox/kit"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// Objects returns the world's sample objects, in creation order: what a
// user applies to a real cluster, with the simulators' addresses filled in.
func (w *World) Objects() ([]client.Object, error) {
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: SystemNamespace}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}},
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: SystemNamespace, Name: "local-pve-token"},
			StringData: map[string]string{"id": proxmoxTokenID, "secret": proxmoxTokenSecret},
		},
		&hfv1.HypervisorCluster{
			ObjectMeta: metav1.ObjectMeta{Name: ClusterName},
			Spec: hfv1.HypervisorClusterSpec{
				Provider: hfv1.ProviderProxmox,
				Endpoint: w.ProxmoxURL,
				Credentials: hfv1.HypervisorCredentials{
					TokenID:     &hfv1.SecretKeySelector{Namespace: SystemNamespace, Name: "local-pve-token", Key: "id"},
					TokenSecret: &hfv1.SecretKeySelector{Namespace: SystemNamespace, Name: "local-pve-token", Key: "secret"},
				},
				TLS:          &hfv1.HypervisorTLS{FingerprintSHA256: w.proxmoxFingerprint},
				Proxmox:      &hfv1.ProxmoxClusterSettings{VMIDRange: &hfv1.VMIDRange{Start: 1000, End: 1999}},
				PollInterval: &metav1.Duration{Duration: 2e9},
			},
		},
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "github"},
			StringData: map[string]string{"token": PAT},
		},
		&hfv1.HypervisorMachineTemplate{
			ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: TemplateName},
			Spec: hfv1.HypervisorMachineTemplateSpec{
				HypervisorClusterRef: hfv1.ObjectName{Name: ClusterName},
				Source:               hfv1.MachineSource{Proxmox: hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9000)}},
				Resources:            w.resources(),
				CloudInit:            w.cloudInit(),
				Bootstrap: hfv1.Bootstrap{AgentSource: w.agentSource(), GitHub: &hfv1.GitHubBootstrap{
					Owner:        Organization,
					Organization: Organization,
					APIBaseURL:   w.GitHubURL + "/api/v3",
					Credentials:  hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "github", Key: "token"}},
					// The operator resolves the newest runner release (the
					// GitHub simulator publishes actions/runner's); the
					// agent downloads that package and checks its SHA-256.
					Runner: &hfv1.RunnerSoftware{Version: "latest"},
				}},
			},
		},
		&hfv1.RunnerPool{
			ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: PoolName},
			Spec: hfv1.RunnerPoolSpec{
				TemplateRef: hfv1.ObjectName{Name: TemplateName},
				Workload:    hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Labels: []string{JobLabel}}},
				Scaling: hfv1.Scaling{MinReplicas: w.opts.MinReplicas, MaxReplicas: w.opts.MaxReplicas,
					ScaleDownDelay: &metav1.Duration{Duration: 10e9}},
			},
		},
	}
	if w.opts.IPPool != nil {
		network := hfv1.MachineNetwork{Mode: hfv1.NetworkModeStatic, IPPoolRef: &hfv1.ObjectName{Name: IPPoolName}}
		if w.opts.IPv6Pool != nil {
			objs = append([]client.Object{&hfv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: IPv6PoolName}, Spec: *w.opts.IPv6Pool.DeepCopy()}}, objs...)
			network.IPPoolRef = nil
			network.IPPoolRefs = []hfv1.ObjectName{{Name: IPPoolName}, {Name: IPv6PoolName}}
		}
		objs = append([]client.Object{&hfv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: IPPoolName}, Spec: *w.opts.IPPool.DeepCopy()}}, objs...)
		for _, o := range objs {
			if t, ok := o.(*hfv1.HypervisorMachineTemplate); ok {
				t.Spec.Network = *network.DeepCopy()
			}
		}
	}
	if d := w.opts.DHCP; d != nil {
		for _, o := range objs {
			if t, ok := o.(*hfv1.HypervisorMachineTemplate); ok {
				t.Spec.Network.DHCP = d.DeepCopy()
			}
		}
	}
	if w.opts.SPIFFE {
		// The samples' SPIFFE settings, so that the world runs what users
		// copy: the join-token template's attestation, and the cluster's
		// spec.spire with the world's own server.
		// With Options.TPM the TPM template's, and the cluster's
		// spec.spire.tpm naming the Secrets makeTPMTrust made.
		var tmpl hfv1.HypervisorMachineTemplate
		var cluster hfv1.HypervisorCluster
		sampleTemplate, method := sampleSPIFFETemplate, hfv1.AttestationJoinToken
		if w.opts.TPM {
			sampleTemplate, method = sampleTPMTemplate, hfv1.AttestationTPM
		}
		if err := readSample(sampleTemplate, &tmpl); err != nil {
			return nil, err
		}
		if err := readSample(sampleSPIRECluster, &cluster); err != nil {
			return nil, err
		}
		if cluster.Spec.SPIRE == nil || tmpl.Spec.Attestation.Method != method {
			return nil, fmt.Errorf("devenv: %s has no spec.spire or %s does not attest with %s", sampleSPIRECluster, sampleTemplate, method)
		}
		if tpm := cluster.Spec.SPIRE.TPM; w.opts.TPM && (tpm == nil || tpm.EKCABundleRef.Name != TPMEKCASecret || tpm.EKCABundleRef.Key != TPMEKCAKey ||
			tpm.EKCABundleRef.Namespace != SystemNamespace || tpm.DevIDCASecretRef.Name != TPMDevIDCASecret || tpm.DevIDCASecretRef.Namespace != SystemNamespace) {
			return nil, fmt.Errorf("devenv: %s's spec.spire.tpm does not name the Secrets %s/%s (key %s) and %s/%s", sampleSPIRECluster,
				SystemNamespace, TPMEKCASecret, TPMEKCAKey, SystemNamespace, TPMDevIDCASecret)
		}
		if !w.opts.TPM {
			// Its Secrets exist with Options.TPM only.
			cluster.Spec.SPIRE.TPM = nil
		}
		for _, o := range objs {
			switch o := o.(type) {
			case *hfv1.HypervisorCluster:
				o.Spec.SPIRE = cluster.Spec.SPIRE.DeepCopy()
				o.Spec.SPIRE.TrustDomain = TrustDomain
				// Real guests reach the server's loopback port at the
				// simulator's GuestHostAddress.
				o.Spec.SPIRE.ServerAddress = w.guestHostPort(w.SPIRE.Address)
				o.Spec.SPIRE.ServerAPI = hfv1.SPIREServerAPI{AdminSocket: w.SPIRE.SocketPath}
				if w.opts.SecretStore {
					_, o.Spec.SPIRE.SecretStore = w.vaultObjects()
				}
			case *hfv1.HypervisorMachineTemplate:
				o.Spec.Attestation = *tmpl.Spec.Attestation.DeepCopy()
			}
		}
	}
	var cluster *hfv1.HypervisorCluster
	for _, o := range objs {
		if c, ok := o.(*hfv1.HypervisorCluster); ok {
			c.Spec.DNS, c.Spec.Network = w.opts.ClusterDNS.DeepCopy(), w.opts.ClusterNetwork.DeepCopy()
			cluster = c
		}
	}
	if w.opts.Libvirt != nil {
		for _, o := range objs {
			if t, ok := o.(*hfv1.HypervisorMachineTemplate); ok {
				w.useLibvirt(cluster, t)
			}
		}
	}
	for i := len(w.opts.Secrets) - 1; i >= 0; i-- {
		// After the system namespace, before the cluster that uses them.
		secret := w.opts.Secrets[i].DeepCopy()
		secret.Namespace = SystemNamespace
		objs = afterSystemNamespace(objs, secret)
	}
	for _, secret := range w.tpmSecrets {
		// Before the cluster that references them.
		objs = afterSystemNamespace(objs, secret.DeepCopy())
	}
	if w.opts.SecretStore {
		// Before the cluster that references it.
		secret, _ := w.vaultObjects()
		objs = afterSystemNamespace(objs, secret)
	}
	if w.opts.Platform == hfv1.WorkloadBuildkite {
		bk, err := w.buildkiteObjects(objs)
		if err != nil {
			return nil, err
		}
		objs = bk
	}
	if w.opts.Platform == hfv1.WorkloadGitLabCI {
		gl, err := w.gitlabObjects(objs)
		if err != nil {
			return nil, err
		}
		objs = gl
	}
	return objs, nil
}

// afterSystemNamespace inserts o right after SystemNamespace's Namespace
// in objs, which need not come first: the IPPools (cluster-scoped) go
// before it.
func afterSystemNamespace(objs []client.Object, o client.Object) []client.Object {
	i := slices.IndexFunc(objs, func(x client.Object) bool {
		ns, ok := x.(*corev1.Namespace)
		return ok && ns.Name == SystemNamespace
	})
	return slices.Insert(objs, i+1, o)
}

// The samples whose SPIFFE settings the world uses (config/samples).
const (
	sampleSPIFFETemplate = "hyperfleet_v1alpha1_hypervisormachinetemplate_spiffe.yaml"
	sampleSPIRECluster   = "hyperfleet_v1alpha1_hypervisorcluster_token.yaml"
	sampleTPMTemplate    = "hyperfleet_v1alpha1_hypervisormachinetemplate_tpm.yaml"
)

// readSample decodes a file of config/samples strictly into obj.
func readSample(name string, obj any) error {
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "samples", name))
	if err != nil {
		return fmt.Errorf("devenv: sample: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, obj); err != nil {
		return fmt.Errorf("devenv: sample %s: %w", name, err)
	}
	return nil
}

// resources are the template's: a real guest under emulation gets one
// core, so that two of them share a small machine.
func (w *World) resources() hfv1.MachineResources {
	if w.opts.GuestImage != nil {
		return hfv1.MachineResources{CPU: 1, Memory: resource.MustParse("1Gi")}
	}
	return hfv1.MachineResources{CPU: 2, Memory: resource.MustParse("2Gi")}
}

// cloudInit is the template's own cloud-init: real guests trust the
// GitHub simulator's CA (cloud-init's ca_certs adds it to the system
// store), as a private GitHub Enterprise Server's users would.
func (w *World) cloudInit() *hfv1.CloudInit {
	if w.opts.GuestImage == nil {
		return nil
	}
	if w.opts.ProxmoxDelivery {
		return &hfv1.CloudInit{Delivery: hfv1.CloudInitDeliveryProxmox, Proxmox: &hfv1.ProxmoxCloudInit{
			VendorSnippet: KitSnippet, User: w.opts.ProxmoxUser, SSHAuthorizedKeys: w.opts.ProxmoxSSHKeys}}
	}
	return &hfv1.CloudInit{UserData: "#cloud-config\n" + w.caCerts()}
}

// caCerts is the cloud-config key that has a guest trust the GitHub
// simulator's CA, and only it: the test world's guests reach no public
// service, and without Debian's ~140 public roots cloud-init's
// update-ca-certificates rebuilds a store of one certificate instead of
// forking a few processes per root, which under QEMU's emulation took
// 40 s of a runner VM's boot on a quiet 2-core machine (the console of a
// lone runner VM with the agent from the operator: "Updating
// certificates" at 39 s, done at 80 s) and about three times that with two guests and their
// operators sharing it (make test-guest).
func (w *World) caCerts() string {
	var b strings.Builder
	b.WriteString("ca_certs:\n  remove_defaults: true\n  trusted:\n    - |\n")
	for _, line := range strings.Split(strings.TrimSpace(string(w.githubCA)), "\n") {
		b.WriteString("      " + line + "\n")
	}
	return b.String()
}

// KitSnippet is the volume of the static kit the world places for
// Options.ProxmoxDelivery.
const KitSnippet = "local:snippets/" + kitFile

const kitFile = "hyperfleet-kit.yaml"

// putKit places, for Options.ProxmoxDelivery, the static kit with the
// GitHub simulator's CA on the simulator's local storage, as a platform
// team copies what "hyperfleet proxmox-kit" prints onto its snippets
// storage and adds its own keys.
func (w *World) putKit() error {
	if !w.opts.ProxmoxDelivery {
		return nil
	}
	if w.opts.GuestImage == nil {
		return errors.New("devenv: ProxmoxDelivery needs GuestImage: only a real guest runs cloud-init")
	}
	snippet := string(kit.VendorData(true)) + w.caCerts()
	if _, err := w.Proxmox.PutSnippet("local", w.Proxmox.State().Nodes[0].Name, kitFile, []byte(snippet)); err != nil {
		return fmt.Errorf("devenv: place the static kit: %w", err)
	}
	return nil
}

// agentSource is the template's: Operator with Options.AgentFromOperator.
func (w *World) agentSource() hfv1.AgentSource {
	if w.opts.AgentFromOperator {
		return hfv1.AgentSourceOperator
	}
	return hfv1.AgentSourceImage
}

// applyObjects creates the sample objects (existing ones are kept).
func (w *World) applyObjects(ctx context.Context) error {
	objs, err := w.Objects()
	if err != nil {
		return err
	}
	for _, obj := range objs {
		if err := w.API.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("devenv: create %T %s: %w", obj, obj.GetName(), err)
		}
	}
	return nil
}
