package controller_test

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestOrphanSweeper: a VM whose verified owner claim no longer exists is
// destroyed after the grace period; VMs with copied, forged or foreign
// markers are never touched, even though they carry the install's tag.
func TestOrphanSweeper(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{sweepInterval: 300 * time.Millisecond, orphanGrace: time.Second})
	f := newFixture(t, sim, nil)
	waitClusterReady(t, f.cluster, "True")

	tags := "hyperfleet;" + testSigner.OperatorTag()
	rec := ownership.Record{Namespace: f.namespace, Name: "ghost", UID: "00000000-dead-beef-0000-000000000001", VMID: 1500, CreatedAt: time.Now().Add(-time.Hour)}
	orphanDesc := f.signer().Description("left behind by a crash", rec)
	handMadeVM(t, sim, 1500, orphanDesc, tags)
	// The orphan's block copied onto another VM: signed for VM 1500.
	handMadeVM(t, sim, 1501, orphanDesc, tags)
	// A block signed with another install's key but this install's id.
	forger, err := ownership.NewSigner(testSigner.OperatorID(), bytes.Repeat([]byte{7}, ownership.MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	forger = forger.ForCluster(f.signer().Cluster())
	forgedRec := rec
	forgedRec.VMID = 1502
	handMadeVM(t, sim, 1502, forger.Description("", forgedRec), tags)
	// An edited block: valid for 1503, then the claim name changed.
	editedRec := rec
	editedRec.VMID = 1503
	edited := bytes.Replace([]byte(f.signer().Description("", editedRec)), []byte("name: ghost"), []byte("name: other"), 1)
	handMadeVM(t, sim, 1503, string(edited), tags)

	eventually(t, 60*time.Second, "orphan 1500 destroyed", func() error {
		for _, vm := range sim.VMs() {
			if vm.VMID == 1500 {
				return fmt.Errorf("VM 1500 still exists (%s)", vm.Status)
			}
		}
		return nil
	})
	// Give the sweeper several more rounds to do something wrong.
	time.Sleep(2 * time.Second)
	for _, vmid := range []int{1501, 1502, 1503} {
		findVM(t, sim, vmid)
	}
	wantEvents(t, f.cluster, "OrphanFound", "OrphanRemoved")
}

// TestOrphanSweeperDryRun reports but never destroys.
func TestOrphanSweeperDryRun(t *testing.T) {
	sim := startSim(t, nil)
	op := startOperator(t, operatorOptions{sweepInterval: 300 * time.Millisecond, orphanGrace: 300 * time.Millisecond, dryRun: true})
	f := newFixture(t, sim, nil)
	waitClusterReady(t, f.cluster, "True")
	rec := ownership.Record{Namespace: f.namespace, Name: "ghost", UID: "00000000-dead-beef-0000-000000000002", VMID: 1600, CreatedAt: time.Now().Add(-time.Hour)}
	handMadeVM(t, sim, 1600, f.signer().Description("", rec), "hyperfleet;"+testSigner.OperatorTag())
	wantEvents(t, f.cluster, "OrphanFound")
	time.Sleep(2 * time.Second)
	findVM(t, sim, 1600)
	if got := op.components.Sweeper.Orphans(); len(got) != 1 {
		t.Errorf("orphans = %v, want the one VM", got)
	}
	// Remove it by hand so the fixture's cluster can be deleted cleanly.
	simCall(t, sim, "DELETE", "/nodes/pve1/qemu/1600", nil)
}

// TestOrphanSweeperFindsUnconfiguredClonesAndStrayISOs: the operator's
// sweeper destroys a clone that was never configured (no tag, only the
// install's keyed name and its marker, as a clone request whose answer was
// lost leaves it) and deletes a cloud-init ISO of this install whose VM
// and claim are gone; a clone with the install's name but no marker, and
// ISOs named by another install or by hand, stay.
func TestOrphanSweeperFindsUnconfiguredClonesAndStrayISOs(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{sweepInterval: 300 * time.Millisecond, orphanGrace: time.Second})
	f := newFixture(t, sim, nil)
	waitClusterReady(t, f.cluster, "True")

	ghost := ownership.Record{Namespace: f.namespace, Name: "ghost", UID: "00000000-dead-beef-0000-000000000007", VMID: 1700, CreatedAt: time.Now().Add(-time.Hour)}
	cloneByHand(t, sim, 1700, url.Values{"name": {testSigner.VMName(1700)}, "description": {f.signer().Description("", ghost)}})
	cloneByHand(t, sim, 1703, url.Values{"name": {testSigner.VMName(1703)}})
	stray := fmt.Sprintf("hf-%s-1701-%s.iso", testSigner.OperatorID(), provider.OwnerDigest(ghost.UID))
	foreign := []string{fmt.Sprintf("hf-elsewhere-1702-%s.iso", provider.OwnerDigest(ghost.UID)), "debian-12-netinst.iso"}
	for _, name := range append([]string{stray}, foreign...) {
		uploadISO(t, sim, name)
	}

	eventually(t, 60*time.Second, "unconfigured clone destroyed and stray ISO deleted", func() error {
		st := sim.State()
		for _, vm := range st.VMs {
			if vm.VMID == 1700 {
				return fmt.Errorf("VM 1700 still exists (%s)", vm.Status)
			}
		}
		if isoExists(st, stray) {
			return fmt.Errorf("ISO %s still exists", stray)
		}
		return nil
	})
	findVM(t, sim, 1703)
	for _, name := range foreign {
		if !isoExists(sim.State(), name) {
			t.Errorf("ISO %s, not this install's, was deleted", name)
		}
	}
	wantEvents(t, f.cluster, "OrphanFound", "OrphanRemoved", "OrphanISOFound", "OrphanISORemoved")
	simCall(t, sim, "DELETE", "/nodes/pve1/qemu/1703", nil)
}

// cloneByHand clones template 9000 to vmid with the given extra clone
// parameters (name, description) and waits for the clone to finish.
func cloneByHand(t *testing.T, sim *simulator, vmid int, params url.Values) {
	t.Helper()
	params.Set("newid", fmt.Sprint(vmid))
	var upid string
	if err := json.Unmarshal(simCall(t, sim, "POST", "/nodes/pve1/qemu/9000/clone", params), &upid); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "hand-made clone done", func() error {
		for _, task := range sim.State().Tasks {
			if task.UPID == upid && !task.Running {
				if task.ExitStatus != "OK" {
					t.Fatalf("hand-made clone failed: %s", task.ExitStatus)
				}
				return nil
			}
		}
		return fmt.Errorf("clone %s running", upid)
	})
}

// uploadISO uploads a small file to the ISO storage "local" of pve1 and
// waits until it is there.
func uploadISO(t *testing.T, sim *simulator, name string) {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	if err := w.WriteField("content", "iso"); err != nil {
		t.Fatal(err)
	}
	fw, err := w.CreateFormFile("filename", name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fw.Write(bytes.Repeat([]byte{0}, 4096)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest("POST", sim.url+"/nodes/pve1/storage/local/upload", &b)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "PVEAPIToken="+simTokenID+"="+simTokenSecret)
	req.Header.Set("Content-Type", w.FormDataContentType())
	// Test-only client for a loopback server with a throwaway certificate.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("upload %s: %s %s", name, res.Status, raw)
	}
	eventually(t, 30*time.Second, "ISO "+name+" uploaded", func() error {
		if !isoExists(sim.State(), name) {
			return fmt.Errorf("not there yet")
		}
		return nil
	})
}

func isoExists(st proxmoxsim.State, name string) bool {
	for _, s := range st.Storages {
		for _, v := range s.Volumes {
			if strings.HasSuffix(v.VolID, ":iso/"+name) {
				return true
			}
		}
	}
	return false
}
