package controller_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// templateSource is a generated spec.source.proxmox reference into the
// simulator's inventory (templateInventory), with what is wrong with it.
type templateSource struct {
	name string
	id   int32  // by id when set
	ref  string // by name otherwise
	// problem is the Valid reason the reference alone earns ("" if none).
	problem string
	// field is the spec field that problem's message names.
	field string
	// linkedOK: its disk can hold linked clones.
	linkedOK bool
}

var templateSources = []templateSource{
	{name: "template by id", id: 9000, linkedOK: true},
	{name: "renamable template by name", ref: "ci-b", linkedOK: true},
	{name: "missing id", id: 9999, problem: "TemplateNotFound", field: "spec.source.proxmox.templateID", linkedOK: true},
	{name: "missing name", ref: "no-such-template", problem: "TemplateNotFound", field: "spec.source.proxmox.templateName", linkedOK: true},
	{name: "plain VM", id: 9002, problem: "NotATemplate", field: "spec.source.proxmox.templateID", linkedOK: true},
	{name: "template without guest agent", id: 9003, problem: string(hfv1.GuestAgentRequiredReason), field: "qm set 9003 --agent", linkedOK: true},
	{name: "template on thick LVM", id: 9004, linkedOK: false},
}

// templateInventory adds property 3's templates, storage and pool to the
// simulator's default cluster (template 9000 on local-lvm).
func templateInventory(c *proxmoxsim.Config) {
	c.Latency = propertyLatency()
	c.RefreshInterval = proxmoxsim.Duration(100 * time.Millisecond)
	// Thick LVM holds VM disks but cannot be the base of a linked clone.
	c.Storages = append(c.Storages, proxmoxsim.StorageConfig{ID: "thick", Type: "lvm", Content: []string{"images"}, Capacity: 500 << 30})
	c.Pools = append(c.Pools, proxmoxsim.PoolConfig{ID: "ci-pool"})
	base := c.Templates[0]
	add := func(vmid int, name string, mutate func(*proxmoxsim.TemplateConfig)) {
		t := base
		t.VMID, t.Name = vmid, name
		if mutate != nil {
			mutate(&t)
		}
		c.Templates = append(c.Templates, t)
	}
	add(9001, "ci-b", nil)
	add(9002, "plain-vm", func(t *proxmoxsim.TemplateConfig) { t.NotTemplate = true })
	add(9003, "no-agent", func(t *proxmoxsim.TemplateConfig) { t.Agent = false })
	add(9004, "on-thick", func(t *proxmoxsim.TemplateConfig) { t.Storage, t.CloudInitStorage = "thick", "" })
}

// renameVM renames a VM on the simulator through its API, as an admin
// would with qm set --name: a template referenced by name disappears, or
// comes back.
func renameVM(sim *simulator, vmid int, name string) error {
	return renameVMAt(sim.url, vmid, name)
}

// renameVMAt renames a VM through the simulator's API at base.
func renameVMAt(base string, vmid int, name string) error {
	form := url.Values{"name": {name}}
	req, err := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/nodes/pve1/qemu/%d/config", base, vmid), strings.NewReader(form.Encode()))
	if err != nil {
		return fmt.Errorf("rename VM %d: %w", vmid, err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "PVEAPIToken="+simTokenID+"="+simTokenSecret)
	// The simulator's loopback certificate is the test's own.
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the test's own loopback simulator
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("rename VM %d: %w", vmid, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("rename VM %d: %s: %s", vmid, resp.Status, body)
	}
	return nil
}

// expectTemplate is the Valid reason ("" for valid) and the field its
// message names for a template of src with the clone mode, storage and
// pool, in the order the checks run (pkg/provider/proxmox/template.go's
// ValidateTemplate, then the guest agent in
// internal/controller/hypervisormachinetemplate_phases.go).
func expectTemplate(src templateSource, linked bool, storage, pool string) (reason, field string) {
	fail := func(r, f string) {
		if reason == "" {
			reason, field = r, f
		}
	}
	if src.problem != "" && src.problem != string(hfv1.GuestAgentRequiredReason) {
		fail(src.problem, src.field)
	}
	switch {
	case linked && !src.linkedOK:
		fail("LinkedCloneUnsupported", "spec.source.proxmox.cloneMode")
	case !linked && storage == "local":
		fail("StorageNoImages", "spec.source.proxmox.storage")
	case !linked && storage == "no-such-storage":
		fail("StorageNotFound", "spec.source.proxmox.storage")
	}
	if pool == "no-such-pool" {
		fail("PoolNotFound", "spec.source.proxmox.pool")
	}
	if src.problem == string(hfv1.GuestAgentRequiredReason) {
		fail(src.problem, src.field)
	}
	return reason, field
}

// templateOf is a template of the cluster with the generated source.
func templateOf(namespace, name, cluster string, src templateSource, linked bool, storage, pool string) *hfv1.HypervisorMachineTemplate {
	tmpl := cheapTemplate(name, cluster)
	tmpl.Namespace = namespace
	tmpl.Spec.Resources = hfv1.MachineResources{CPU: 1, Memory: resource.MustParse("1Gi")}
	ps := &tmpl.Spec.Source.Proxmox
	ps.TemplateID, ps.TemplateName = nil, src.ref
	if src.id != 0 {
		ps.TemplateID = ptr.To(src.id)
	}
	ps.CloneMode, ps.Storage, ps.Pool = hfv1.CloneModeFull, storage, pool
	if linked {
		ps.CloneMode = hfv1.CloneModeLinked
	}
	return tmpl
}

// validState checks a template's validation of its current generation
// against reason ("" for valid) and that an invalid one's message names
// field.
func validState(tmpl *hfv1.HypervisorMachineTemplate, reason, field string) error {
	if tmpl.Status.ObservedGeneration != tmpl.Generation {
		return errors.New("not validated yet")
	}
	c := meta.FindStatusCondition(tmpl.Status.Conditions, string(hfv1.HypervisorMachineTemplateValidCondition))
	switch {
	case c == nil:
		return errors.New("no Valid condition")
	case reason == "" && c.Status != metav1.ConditionTrue:
		return fmt.Errorf("Valid is %s (%s: %s)", c.Status, c.Reason, c.Message)
	case reason != "" && (c.Status != metav1.ConditionFalse || c.Reason != reason):
		return fmt.Errorf("Valid is %s (%s: %s), want False (%s)", c.Status, c.Reason, c.Message, reason)
	case reason != "" && !strings.Contains(c.Message, field):
		return fmt.Errorf("invalid (%s) without naming %s: %s", reason, field, c.Message)
	}
	return nil
}

// waitsForTemplate checks that a claim waits for its template, naming it.
func waitsForTemplate(c *hfv1.MachineClaim, template string) error {
	cond := meta.FindStatusCondition(c.Status.Conditions, string(hfv1.MachineClaimProvisionedCondition))
	if cond == nil || cond.Reason != string(hfv1.TemplateNotReadyReason) || !strings.Contains(cond.Message, template) {
		return fmt.Errorf("Provisioned is %+v", cond)
	}
	return nil
}

// Feature: hyperfleet-operator, Property 3: Template Validation and Management
//
// TestTemplateValidationProperty, in the cheap world (cheapworld_test.go:
// the reconcilers on the fake API server, the real Proxmox provider
// against the in-process simulator holding templateInventory, fake time):
// a HypervisorMachineTemplate with a generated source (a template by id or
// name, missing, a plain VM, one without a guest agent, one whose disk
// cannot hold linked clones), clone mode, target storage (none, one that
// holds VM disks, one that does not, a missing one) and resource pool
// (none, existing, missing) is Valid exactly when the hypervisor can build
// from it; otherwise its Valid condition gives the reason of the first
// problem and its message names the field or the fix, and a claim of it
// waits, saying so, with no VM at any moment of a minute of fake time. A
// template referred to by name that disappears from the hypervisor (an
// admin renames it) becomes invalid when it is next validated (its spec
// edited, or its periodic recheck: both are drawn), its claims wait, and
// they go on once it is back. A valid template's claim gets its VM, and
// goes with it when deleted. The CRD's refusal of a target storage for a
// linked clone is the real API server's: TestTemplateValidationScenarios.
//
// Mutation: the template reconciler never validating a template again
// once Valid (hypervisormachinetemplate_phases.go's checkOnHypervisor
// skipped for a template whose Valid condition is True at its generation,
// i.e. no periodic recheck) fails this test: a template renamed away on
// the hypervisor stays Valid until its spec is edited. The envtest test
// passed it: it always edited the spec to make the operator look again.
func TestTemplateValidationProperty(t *testing.T) {
	w := newCheapWorld(t, cheapOptions{maxRetryDelay: time.Second})
	sim := w.StartSim(templateInventory)
	cluster := w.AddCluster("pve", sim)
	var valid, invalid, renamed, rechecked, n int
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		defer w.Case(rt)()
		n++
		name := fmt.Sprintf("p3-%d", n)
		// Half the cases draw from what the hypervisor can build only,
		// the other half from anything (rapid favours the first choices,
		// and most combinations are broken somewhere). A linked clone
		// never names a target storage: the API refuses it.
		var src templateSource
		var linked bool
		var storage, pool string
		if rapid.Bool().Draw(rt, "anything") {
			src = rapid.SampledFrom(templateSources).Draw(rt, "source")
			linked = rapid.Bool().Draw(rt, "linked clone")
			if !linked {
				storage = rapid.SampledFrom([]string{"", "local-lvm", "local", "no-such-storage"}).Draw(rt, "storage")
			}
			pool = rapid.SampledFrom([]string{"", "ci-pool", "no-such-pool"}).Draw(rt, "pool")
		} else {
			src = rapid.SampledFrom([]templateSource{templateSources[1], templateSources[0], templateSources[6]}).Draw(rt, "buildable source")
			linked = src.linkedOK && rapid.Bool().Draw(rt, "linked clone")
			if !linked {
				storage = rapid.SampledFrom([]string{"", "local-lvm"}).Draw(rt, "storage")
			}
			pool = rapid.SampledFrom([]string{"", "ci-pool"}).Draw(rt, "pool")
		}
		reason, field := expectTemplate(src, linked, storage, pool)
		tmpl := templateOf(cheapNamespace, name, cluster.Name, src, linked, storage, pool)
		w.Create(tmpl)
		claim := cheapClaim(name, name)
		defer w.removeAll(sim, claim, tmpl)
		validated := func(reason, field string) {
			rt.Helper()
			w.RunUntil(15*time.Minute, fmt.Sprintf("template %s validated (%q)", name, reason), func() error {
				if !w.Get(tmpl) {
					return errors.New("template gone")
				}
				return validState(tmpl, reason, field)
			})
		}
		validated(reason, field)
		gone := reason == "" && src.ref == "ci-b" && rapid.Bool().Draw(rt, "renamed away")
		bump := func() {
			// Edited (its generation moves), or left to the periodic
			// recheck, which the fake time reaches.
			if rapid.Bool().Draw(rt, "edited to look again") {
				cheapEdit(w, tmpl, func(tm *hfv1.HypervisorMachineTemplate) { tm.Spec.Resources.CPU = tm.Spec.Resources.CPU%4 + 1 })
			} else {
				rechecked++
			}
		}
		if gone {
			renamed++
			if err := renameVMAt(sim.url, 9001, "ci-b-gone"); err != nil {
				rt.Fatal(err)
			}
			defer func() { _ = renameVMAt(sim.url, 9001, "ci-b") }()
			w.Advance(time.Second)
			sim.RefreshResources()
			bump()
			reason, field = "TemplateNotFound", "spec.source.proxmox.templateName"
			validated(reason, field)
		}
		w.Create(claim)
		if reason != "" {
			invalid++
			w.RunFor(time.Minute, "claim "+name+" of invalid template ("+reason+")", func() error {
				if !w.Get(claim) {
					return errors.New("claim gone")
				}
				if vms := cheapVMsOf(sim.Simulator, string(claim.UID)); len(vms) > 0 || claim.Status.VMRef != nil {
					return fmt.Errorf("got VM %v %+v", vms, claim.Status.VMRef)
				}
				return nil
			})
			if err := waitsForTemplate(claim, name); err != nil {
				rt.Fatalf("claim %s of invalid template (%s): %v", name, reason, err)
			}
		}
		if gone {
			// Added back: the next validation finds it and the claim
			// goes on.
			if err := renameVMAt(sim.url, 9001, "ci-b"); err != nil {
				rt.Fatal(err)
			}
			w.Advance(time.Second)
			sim.RefreshResources()
			bump()
			reason = ""
			validated("", "")
		}
		if reason == "" {
			valid++
			w.RunUntil(5*time.Minute, "claim "+name+" has a VM", func() error { return w.hasVM(sim, claim) })
		}
	})
	t.Logf("templates: %d valid, %d invalid, %d renamed away and back (%d validations left to the recheck); %d reconciles", valid, invalid, renamed, rechecked, w.Reconciles)
	// The shares need the full count of cases: under -short (the race run)
	// rapid runs a fifth of them, which need not draw every kind.
	if cases := valid + invalid; !testing.Short() && (valid*10 < cases || invalid*5 < cases || renamed == 0) {
		t.Errorf("the generator made %d valid and %d invalid templates of %d (%d renamed, %d left to the recheck); want a tenth and a fifth at least and a rename", valid, invalid, cases, renamed, rechecked)
	}
}

// TestTemplateValidationScenarios drives property 3's paths through the
// whole operator against the real API server, one fixed case each: the
// API's refusal of a linked clone with a target storage (the CRD's rule,
// which the cheap world cannot decide), a plain VM referred to as a
// template, and a template referred to by name renamed away on the
// hypervisor and back. The property itself is
// TestTemplateValidationProperty.
func TestTemplateValidationScenarios(t *testing.T) {
	longScenario(t)
	sim := startSim(t, templateInventory)
	op := startOperator(t, operatorOptions{maxRetryDelay: time.Second})
	w := &propertyWorld{sim: sim, op: op, f: newFixture(t, sim, nil)}
	ctx := context.Background()

	t.Run("linked clone with a target storage refused", func(t *testing.T) {
		tmpl := templateOf(w.f.namespace, "p3-refused", w.f.cluster.Name, templateSources[0], true, "local-lvm", "")
		err := env.Client.Create(ctx, tmpl)
		if err == nil {
			_ = env.Client.Delete(ctx, tmpl)
			t.Fatalf("template %+v accepted: a linked clone with a target storage", tmpl.Spec.Source.Proxmox)
		}
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "storage") || !strings.Contains(err.Error(), "cloneMode: full") {
			t.Fatalf("template refused without naming storage and the fix: %v", err)
		}
	})
	waitValid := func(t *testing.T, tmpl *hfv1.HypervisorMachineTemplate, reason, field string) {
		t.Helper()
		eventually(t, 15*time.Second, fmt.Sprintf("template %s validated (%q)", tmpl.Name, reason), func() error {
			var got hfv1.HypervisorMachineTemplate
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(tmpl), &got); err != nil {
				return err
			}
			return validState(&got, reason, field)
		})
	}
	bumpCPU := func(t *testing.T, tmpl *hfv1.HypervisorMachineTemplate) {
		t.Helper()
		if err := retry.RetryOnConflict(conflictRetry, func() error {
			var got hfv1.HypervisorMachineTemplate
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(tmpl), &got); err != nil {
				return err
			}
			got.Spec.Resources.CPU = got.Spec.Resources.CPU%4 + 1
			return env.Client.Update(ctx, &got)
		}); err != nil {
			t.Fatal(err)
		}
	}
	claimOf := func(t *testing.T, name string) *hfv1.MachineClaim {
		t.Helper()
		claim := &hfv1.MachineClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: w.f.namespace, Name: name},
			Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: name}},
		}
		if err := env.Client.Create(ctx, claim); err != nil {
			t.Fatal(err)
		}
		return claim
	}
	waits := func(t *testing.T, claim *hfv1.MachineClaim) {
		t.Helper()
		eventually(t, 10*time.Second, "claim "+claim.Name+" waiting for its template", func() error {
			c, err := getClaim(t, claim)
			if err != nil {
				return err
			}
			return waitsForTemplate(c, claim.Name)
		})
		c, err := getClaim(t, claim)
		if err != nil {
			t.Fatal(err)
		}
		if vms := w.vmsOf(string(c.UID)); len(vms) > 0 || c.Status.VMRef != nil {
			t.Fatalf("claim %s of an invalid template got VM %v %+v", claim.Name, vms, c.Status.VMRef)
		}
	}
	remove := func(t *testing.T, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) {
		t.Helper()
		got, err := getClaim(t, claim)
		if err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Delete(ctx, got); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "claim "+claim.Name+" gone", func() error {
			if _, err := getClaim(t, claim); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there (%w)", err)
			}
			if vms := w.vmsOf(string(got.UID)); len(vms) > 0 {
				return fmt.Errorf("its VM %d is still there", vms[0].VMID)
			}
			return nil
		})
		_ = env.Client.Delete(ctx, tmpl)
	}

	t.Run("plain VM", func(t *testing.T) {
		tmpl := templateOf(w.f.namespace, "p3-plain", w.f.cluster.Name, templateSources[4], false, "", "")
		if err := env.Client.Create(ctx, tmpl); err != nil {
			t.Fatal(err)
		}
		reason, field := expectTemplate(templateSources[4], false, "", "")
		waitValid(t, tmpl, reason, field)
		claim := claimOf(t, tmpl.Name)
		waits(t, claim)
		remove(t, claim, tmpl)
	})

	t.Run("renamed away and back", func(t *testing.T) {
		tmpl := templateOf(w.f.namespace, "p3-renamed", w.f.cluster.Name, templateSources[1], true, "", "ci-pool")
		if err := env.Client.Create(ctx, tmpl); err != nil {
			t.Fatal(err)
		}
		waitValid(t, tmpl, "", "")
		if err := renameVM(sim, 9001, "ci-b-gone"); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = renameVM(sim, 9001, "ci-b") }()
		bumpCPU(t, tmpl)
		waitValid(t, tmpl, "TemplateNotFound", "spec.source.proxmox.templateName")
		claim := claimOf(t, tmpl.Name)
		waits(t, claim)
		if err := renameVM(sim, 9001, "ci-b"); err != nil {
			t.Fatal(err)
		}
		// The cluster's listing shows the name again once pvestatd has
		// run; until then the template is rightly not found.
		sim.RefreshResources()
		bumpCPU(t, tmpl)
		waitValid(t, tmpl, "", "")
		eventually(t, 15*time.Second, "claim "+claim.Name+" has a VM", func() error {
			c, err := getClaim(t, claim)
			if err != nil {
				return err
			}
			if len(w.vmsOf(string(c.UID))) == 0 {
				return fmt.Errorf("phase %s, conditions %v", c.Status.Phase, c.Status.Conditions)
			}
			return nil
		})
		remove(t, claim, tmpl)
	})
}
