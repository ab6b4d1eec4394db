//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	yaml "go.yaml.in/yaml/v3"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// isoWatch keeps every cloud-init ISO seen on the simulator's storage, as
// whoever can read the hypervisor's ISO storage would: the operator
// deletes a VM's ISO once the VM runs, so it is read while VMs are built.
type isoWatch struct {
	mu   sync.Mutex
	isos map[string]proxmoxsim.VolumeState
}

func watchISOs(t *testing.T, w *devenv.World) *isoWatch {
	iw := &isoWatch{isos: map[string]proxmoxsim.VolumeState{}}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			for _, st := range w.Proxmox.State().Storages {
				for _, v := range st.Volumes {
					if v.Content == "iso" && strings.HasPrefix(v.VolID[strings.Index(v.VolID, "/")+1:], "hf-") && len(v.Data) > 0 {
						iw.mu.Lock()
						iw.isos[v.VolID] = v
						iw.mu.Unlock()
					}
				}
			}
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { close(done); wg.Wait() })
	return iw
}

// of is the seed ISO of VM vmid (hf-<operator id>-<vmid>-<digest>.iso).
func (iw *isoWatch) of(vmid int) (proxmoxsim.VolumeState, bool) {
	iw.mu.Lock()
	defer iw.mu.Unlock()
	for id, v := range iw.isos {
		if strings.Contains(id, fmt.Sprintf("-%d-", vmid)) {
			return v, true
		}
	}
	return proxmoxsim.VolumeState{}, false
}

// seedAgentConfig is the agent.json the seed's user-data writes, as the
// reader of the ISO extracts it.
func seedAgentConfig(t *testing.T, iso proxmoxsim.VolumeState) map[string]any {
	t.Helper()
	var doc struct {
		WriteFiles []struct {
			Path    string `yaml:"path"`
			Content string `yaml:"content"`
		} `yaml:"write_files"`
	}
	if err := yaml.Unmarshal([]byte(iso.Files["user-data"]), &doc); err != nil {
		t.Fatalf("the seed's user-data: %v", err)
	}
	for _, f := range doc.WriteFiles {
		if f.Path == agentconfig.Path {
			var cfg map[string]any
			if err := json.Unmarshal([]byte(f.Content), &cfg); err != nil {
				t.Fatalf("the seed's agent.json: %v", err)
			}
			return cfg
		}
	}
	t.Fatalf("the seed %s writes no %s", iso.VolID, agentconfig.Path)
	return nil
}

// claimOfVM is the world's claim whose VM is vmid.
func claimOfVM(t *testing.T, w *devenv.World, vmid int) *hfv1.MachineClaim {
	t.Helper()
	var found *hfv1.MachineClaim
	eventually(t, time.Minute, fmt.Sprintf("the claim of VM %d", vmid), func() error {
		var list hfv1.MachineClaimList
		if err := w.API.Client.List(context.Background(), &list, client.InNamespace(devenv.Namespace)); err != nil {
			return err
		}
		for i := range list.Items {
			if ref := list.Items[i].Status.VMRef; ref != nil && int(ref.VMID) == vmid {
				found = &list.Items[i]
				return nil
			}
		}
		return errors.New("none yet")
	})
	return found
}

// TestNothingUsableOnTheSeed: whoever reads the hypervisor's ISO storage
// while a VM is built finds no runner credential on the seed of a VM
// whose template does not attest (direct mode, the default): its
// agent.json has no jitConfig or registrationToken, and the JIT
// configuration the running VM then receives through its guest agent
// appears nowhere in the ISO's bytes. The reader performs the attack: it
// registers a runner with any credential the seed's agent.json holds (on
// the code before the guest channel, the seed's jitConfig connects a
// runner that takes the job meant for the VM, with its secrets) and sends
// the claim's ready hint with the notice token the seed does hold, which
// only makes the operator look at its VM: the credential still goes to
// the VM alone. The held VM then powers off without running, and the
// pool's next VM runs the job, once.
func TestNothingUsableOnTheSeed(t *testing.T) {
	w, watch := startWorld(t)
	ctx := context.Background()
	release := make(chan struct{})
	isos := watchISOs(t, w)
	ids, err := w.EnqueueJobs(1, jobDuration)
	if err != nil {
		t.Fatal(err)
	}
	g := holdAgent(t, w, release)
	iso, ok := isos.of(g.VMID)
	if !ok {
		t.Fatalf("the seed ISO of VM %d was never seen on the storage", g.VMID)
	}
	cfg := seedAgentConfig(t, iso)

	// The attack: register a runner with what the seed holds, before the
	// VM's agent does.
	for _, field := range []string{"jitConfig", "registrationToken"} {
		if v, _ := cfg[field].(string); v != "" {
			t.Errorf("the seed's agent.json holds %s (%d characters)", field, len(v))
			if field == "jitConfig" {
				stealJob(t, w, v, ids[0])
			}
		}
	}
	if cfg["secretsFile"] != agentconfig.SecretsFile || cfg["secretsDeadline"] == nil {
		t.Errorf("the seed's agent.json does not name where and until when the credential arrives: secretsFile %v, secretsDeadline %v", cfg["secretsFile"], cfg["secretsDeadline"])
	}
	claim := claimOfVM(t, w, g.VMID)
	if n, _ := cfg["powerOffNotify"].(map[string]any); n != nil {
		// The notice token is the seed's one secret: with it, the reader
		// can only make the operator look at the VM now.
		code := readyHint(t, w, n)
		t.Logf("a ready hint with the seed's notice token: HTTP %d", code)
	}

	// The credential arrives in the running VM, and only there.
	var placed agentconfig.GuestSecrets
	eventually(t, time.Minute, "the runner credential placed in the running VM", func() error {
		b, _, err := w.Proxmox.GuestFile(ctx, g.VMID, agentconfig.SecretsFile)
		if err != nil {
			return err
		}
		placed, err = agentconfig.ParseGuestSecrets(b)
		return err
	})
	if placed.JITConfig == "" || placed.JoinToken != "" {
		t.Fatalf("the VM received %d characters of JIT configuration and a join token %v; want the JIT configuration alone", len(placed.JITConfig), placed.JoinToken != "")
	}
	for _, part := range []string{placed.JITConfig, placed.JITConfig[:24], placed.JITConfig[len(placed.JITConfig)-24:]} {
		if strings.Contains(string(iso.Data), part) {
			t.Errorf("the JIT configuration the VM received (%.8s…) is in the bytes of its seed ISO %s", part, iso.VolID)
		}
		for name, content := range iso.Files {
			if strings.Contains(content, part) {
				t.Errorf("the JIT configuration the VM received is in the seed's %s", name)
			}
		}
	}
	eventually(t, time.Minute, "the claim records the delivery", func() error {
		got := &hfv1.MachineClaim{}
		if err := w.API.Client.Get(ctx, client.ObjectKeyFromObject(claim), got); err != nil {
			return err
		}
		if b := got.Status.Bootstrap; b == nil || b.CredentialRequestedAt == nil || b.CredentialDeliveredAt == nil {
			return fmt.Errorf("status.bootstrap %+v", b)
		}
		return nil
	})

	// The held VM powers off without running its runner; the pool's next
	// VM runs the job, once.
	close(release)
	waitDone(t, w, 5*time.Minute)
	watch.stop()
	checkJobs(t, w, watch, 1)
}

// holdAgent holds back the agent of the next VM that boots: its guest
// program only does what cloud-init's bootcmd does (the directory its
// secrets arrive in), then waits until release is closed (the VM then
// powers off) or the VM stops. The VMs after it run the agent again.
func holdAgent(t *testing.T, w *devenv.World, release <-chan struct{}) proxmoxsim.Guest {
	t.Helper()
	held := make(chan proxmoxsim.Guest, 8)
	if err := w.Proxmox.SetGuestProgram(func(ctx context.Context, g proxmoxsim.Guest) error {
		if err := os.MkdirAll(filepath.Join(g.Root, agentconfig.SecretsDir), 0o700); err != nil {
			return err
		}
		select {
		case held <- g:
		default:
		}
		select {
		case <-ctx.Done():
		case <-release:
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var g proxmoxsim.Guest
	select {
	case g = <-held:
	case <-time.After(3 * time.Minute):
		t.Fatal("no VM booted within 3 minutes")
	}
	if err := w.Proxmox.SetGuestProgram(nil); err != nil {
		t.Fatal(err)
	}
	return g
}

// stealJob is the storage reader's attack with a JIT configuration found
// on a seed: a runner connects with it, as the VM's would, and takes the
// job if it can. It fails the test saying what the thief got.
func stealJob(t *testing.T, w *devenv.World, jit string, job int64) {
	t.Helper()
	ca, err := os.ReadFile(filepath.Join(w.Dir(), "github-ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	var out strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := &githubsim.JITRunner{Client: hc, Out: &out, PollWait: time.Second}
	conclusion, err := r.Run(ctx, jit)
	j, _ := w.GitHub.Job(job)
	t.Errorf("a runner started with the seed's JIT configuration: %v, conclusion %q; job %d ran on runner %q; its output:\n%s", err, conclusion, job, j.RunnerName, out.String())
}

// readyHint sends the claim's ready hint with the notice settings n (as
// the seed's agent.json has them) and returns the HTTP status.
func readyHint(t *testing.T, w *devenv.World, n map[string]any) int {
	t.Helper()
	raw, err := json.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	var notify agentconfig.PowerOffNotify
	if err := json.Unmarshal(raw, &notify); err != nil {
		t.Fatal(err)
	}
	if notify.ReadyURL == "" {
		return 0
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(notify.CA))
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	req, err := http.NewRequest(http.MethodPost, notify.ReadyHintURL(), http.NoBody)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+notify.Token)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("ready hint: %v", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}
