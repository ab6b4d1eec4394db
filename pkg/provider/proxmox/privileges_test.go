package proxmox

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox/privileges"
)

var updateRoles = flag.Bool("update-roles", false, "rewrite testdata/roles.json from the recorded calls")

// rolesFile holds the minimal roles derived from the calls each feature set
// makes; hack/proxmox-roles writes them into docs/install.md.
const rolesFile = "testdata/roles.json"

// featureSet is one way the operator uses Proxmox: its template, its spec
// and the calls around the VM's life.
type featureSet struct {
	name string
	// sim adds what the feature needs to the simulated cluster.
	sim func(t *testing.T, e *env, spec *provider.VMSpec)
	// spec adapts testSpec.
	spec func(t *testing.T, spec *provider.VMSpec)
	// use, when set, is what the feature does with the running VM before
	// it is deleted; it returns the VM's progress.
	use func(e *env, spec *provider.VMSpec, prog provider.Progress) (provider.Progress, error)
}

// featureSets are the roles' feature sets, base first: each later set is
// base plus its feature.
func featureSets() []featureSet {
	return []featureSet{
		{name: "base", spec: func(*testing.T, *provider.VMSpec) {}},
		// SPIFFE with TPM attestation: a template with a TPM 2.0 of its own
		// (its clones copy it) and the join token written into the guest.
		{name: "spiffe-tpm", spec: func(_ *testing.T, s *provider.VMSpec) {
			s.Source = provider.TemplateSource{Linked: true, TPM: &provider.VMTPM{}, Settings: TemplateRef{ID: 9010}}
			s.TPM = &provider.VMTPM{}
		}},
		// delivery: proxmox: Proxmox's own cloud-init drive.
		{name: "delivery-proxmox", spec: func(t *testing.T, s *provider.VMSpec) {
			n := nativeSpec(t, s.Name, s.Owner.UID, "")
			s.CloudInit, s.Native = n.CloudInit, n.Native
		}, sim: func(t *testing.T, e *env, s *provider.VMSpec) {
			kit, err := e.sim.PutSnippet("local", "pve1", "hyperfleet-kit.yaml", []byte("#cloud-config\n"))
			if err != nil {
				t.Fatal(err)
			}
			s.Native.VendorData = kit
		}},
		// addVirtualTPM: a fresh tpmstate0 on the boot disk's storage.
		{name: "vtpm", spec: func(_ *testing.T, s *provider.VMSpec) {
			s.Source.TPM = &provider.VMTPM{Add: true}
			s.TPM = &provider.VMTPM{Add: true}
		}},
		// spec.source.proxmox.pool: the clone goes into a resource pool.
		{name: "pools", spec: func(_ *testing.T, s *provider.VMSpec) { s.Source.Settings = TemplateRef{ID: 9000, ResourcePool: "ci"} }},
		// The standby tier: the VM suspended to disk, resumed, suspended
		// again and deleted so.
		{name: "standby", spec: func(*testing.T, *provider.VMSpec) {}, use: standby},
		// spec.network.isolation: the policy's security group, the VM's
		// firewall options, rule and ipfilter IPSet, the datacenter
		// firewall read by Probe, and the sweep's deletion of the group.
		{name: "isolation", spec: func(_ *testing.T, s *provider.VMSpec) {
			s.Isolation = isolationSpec(s.Name, s.Owner.UID).Isolation
		}, sim: func(_ *testing.T, e *env, _ *provider.VMSpec) { e.p.cfg.Isolated = true }, use: sweepIsolation},
		// spec.hardware: the cpu option (CPU model host, nested
		// virtualization) and an extra disk allocated on a storage.
		{name: "hardware", spec: func(_ *testing.T, s *provider.VMSpec) {
			s.Hardware = &provider.Hardware{CPUType: "host", NestedVirtualization: true, ExtraDisks: []provider.Disk{{Bytes: 1 << 30, Storage: "local-lvm"}}}
			s.Source.Hardware = s.Hardware
		}},
		// spec.hardware.devices: a device of a PCI resource mapping,
		// looked up by ValidateTemplate and placement, written as
		// hostpci0 and taken at the start.
		{name: "devices", spec: func(_ *testing.T, s *provider.VMSpec) {
			s.Hardware = &provider.Hardware{Devices: []string{"gpu"}}
			s.Source.Hardware = s.Hardware
		}, sim: func(t *testing.T, e *env, _ *provider.VMSpec) {
			if err := e.sim.SetPCIMapping(proxmoxsim.PCIMapping{ID: "gpu", Devices: []proxmoxsim.PCIDevice{{Node: "pve1", Path: "0000:01:00.0"}}}); err != nil {
				t.Fatal(err)
			}
		}},
	}
}

// sweepIsolation deletes the isolation objects the VM's policy made, as
// the orphan sweep does once no claim needs them.
func sweepIsolation(e *env, _ *provider.VMSpec, prog provider.Progress) (provider.Progress, error) {
	ctx := context.Background()
	objects, err := e.p.ListIsolationObjects(ctx)
	if err != nil {
		return prog, fmt.Errorf("ListIsolationObjects: %w", err)
	}
	for _, o := range objects {
		if err := e.p.DeleteIsolationObject(ctx, o); err != nil {
			return prog, fmt.Errorf("DeleteIsolationObject: %w", err)
		}
	}
	return prog, nil
}

// standby suspends the VM to disk, resumes it to Running, and suspends it
// again, as the standby tier does with a VM between jobs.
func standby(e *env, spec *provider.VMSpec, prog provider.Progress) (provider.Progress, error) {
	ctx := context.Background()
	power := func(action provider.PowerAction, want provider.PowerState) error {
		if _, err := e.p.SetPower(ctx, spec.Owner, prog.VMRef(), action); err != nil {
			return fmt.Errorf("SetPower(%s): %w", action, err)
		}
		for range 120 {
			vm, err := e.p.GetVM(ctx, prog.VMRef())
			if err != nil {
				return fmt.Errorf("GetVM: %w", err)
			}
			if vm.Power == want {
				return nil
			}
			e.advance(time.Second)
		}
		return fmt.Errorf("SetPower(%s): not %s after two minutes", action, want)
	}
	if err := power(provider.PowerSuspend, provider.PowerSuspended); err != nil {
		return prog, err
	}
	res, err := e.p.EnsureVM(ctx, spec, prog)
	if err != nil {
		return prog, fmt.Errorf("EnsureVM of the suspended VM: %w", err)
	}
	if res.Phase != provider.PhaseSuspended {
		return prog, fmt.Errorf("EnsureVM of the suspended VM: %s", res.Phase)
	}
	if err := power(provider.PowerResume, provider.PowerRunning); err != nil {
		return prog, err
	}
	if prog, err = ensureRunning(e, spec, prog); err != nil {
		return prog, fmt.Errorf("EnsureVM after the resume: %w", err)
	}
	return prog, power(provider.PowerSuspend, provider.PowerSuspended)
}

// privEnv is an env on Proxmox VE v whose operator token holds role on /
// (privilege-separated, its user an Administrator), or the user's own
// Administrator when role is nil; log receives the simulator's checks.
func privEnv(t *testing.T, v privileges.Version, role []string, log func(proxmoxsim.CallRecord)) *env {
	var simOpts []proxmoxsim.Option
	if log != nil {
		simOpts = append(simOpts, proxmoxsim.WithCallLog(log))
	}
	return newEnvWith(t, simOpts, func(sim *proxmoxsim.Config, _ *provider.ClusterConfig) {
		sim.PVEVersion = int(v)
		sim.Templates = append(sim.Templates, proxmoxsim.TemplateConfig{VMID: 9010, Node: "pve1", Name: "tpm2",
			Storage: "local-lvm", Agent: true, TPMVersion: "v2.0", CloudInitStorage: "local-lvm"})
		if role == nil {
			return
		}
		for i := range sim.Users {
			if sim.Users[i].ID == opUser {
				yes := true
				sim.Users[i].Tokens[0].Privsep = &yes
				sim.Users[i].Tokens[0].Privileges = proxmoxsim.Privileges{"/": role}
			}
		}
	})
}

// runFeature drives what the operator does for one claim of fs: probe the
// cluster, validate the template, create the VM to Running, read it, write
// the credential into the guest, list the cloud-init media, delete the VM.
// It returns the first error that is not transient.
func runFeature(t *testing.T, e *env, fs featureSet) error {
	t.Helper()
	ctx := context.Background()
	spec := testSpec("runner-"+fs.name, "uid-"+fs.name)
	fs.spec(t, spec)
	if fs.sim != nil {
		fs.sim(t, e, spec)
	}
	if _, err := e.p.Probe(ctx); err != nil {
		return fmt.Errorf("Probe: %w", err)
	}
	src := spec.Source
	if spec.Native != nil {
		src.Native = &provider.NativeFiles{VendorData: spec.Native.VendorData}
	}
	if _, err := e.p.ValidateTemplate(ctx, src); err != nil {
		return fmt.Errorf("ValidateTemplate: %w", err)
	}
	prog, err := ensureRunning(e, spec, provider.Progress{})
	if err != nil {
		return fmt.Errorf("EnsureVM: %w", err)
	}
	if _, err := e.p.ListVMs(ctx); err != nil {
		return fmt.Errorf("ListVMs: %w", err)
	}
	if _, err := e.p.GetVM(ctx, prog.VMRef()); err != nil {
		return fmt.Errorf("GetVM: %w", err)
	}
	if err := e.p.PlaceGuestFile(ctx, spec.Owner, prog.VMRef(), provider.GuestFile{Path: "/run/hyperfleet/secrets.json", Content: []byte(`{"jitConfig":"eyJh"}`)}); err != nil {
		return fmt.Errorf("PlaceGuestFile: %w", err)
	}
	if _, err := e.p.ListCloudInitMedia(ctx); err != nil {
		return fmt.Errorf("ListCloudInitMedia: %w", err)
	}
	if fs.use != nil {
		if prog, err = fs.use(e, spec, prog); err != nil {
			return err
		}
	}
	_, err = driveUntil(e, func() (provider.Progress, bool, error) {
		res, err := e.p.DeleteVM(ctx, spec.Owner, prog)
		if err != nil {
			return provider.Progress{}, false, err
		}
		prog = res.Progress
		e.advance(res.RetryAfter)
		return prog, res.Done, nil
	})
	if err != nil {
		return fmt.Errorf("DeleteVM: %w", err)
	}
	if e.nonTemplateVMs() != 0 {
		return fmt.Errorf("the VM survived DeleteVM")
	}
	return nil
}

// ensureRunning calls EnsureVM from prog until the VM is Running.
func ensureRunning(e *env, spec *provider.VMSpec, prog provider.Progress) (provider.Progress, error) {
	return driveUntil(e, func() (provider.Progress, bool, error) {
		res, err := e.p.EnsureVM(context.Background(), spec, prog)
		if err != nil {
			return prog, false, err
		}
		prog = res.Progress
		e.advance(res.RetryAfter)
		return prog, res.Phase == provider.PhaseRunning, nil
	})
}

// driveUntil calls step until it reports done, advancing the clocks a
// second after a transient error; it returns the first other error.
func driveUntil(e *env, step func() (provider.Progress, bool, error)) (provider.Progress, error) {
	for range 400 {
		prog, done, err := step()
		switch {
		case err == nil && done:
			return prog, nil
		case err != nil && provider.Classify(err) != provider.ClassTransient:
			return prog, err
		case err != nil:
			e.advance(time.Second)
		}
	}
	return provider.Progress{}, fmt.Errorf("not done in 400 calls")
}

// rolesDoc is testdata/roles.json.
type rolesDoc struct {
	// Features in order, base first.
	Features []string `json:"features"`
	// Calls are the endpoints each feature set's run sent (method and
	// path template), the same on every version.
	Calls map[string][]string `json:"calls"`
	// Roles are the minimal privileges per version and feature set: what
	// the feature set's own run needs. A cluster's role is base's plus
	// those of the features its templates use.
	Roles map[string]map[string][]string `json:"roles"`
	// Why lists per version and privilege of a role the endpoints whose
	// checks or filters it satisfies.
	Why map[string]map[string][]string `json:"why"`
}

// recordRoles runs every feature set on every version with an
// Administrator token, records the simulator's checks and the provider's
// calls, and derives the minimal role of each.
func recordRoles(t *testing.T) rolesDoc {
	doc := rolesDoc{Calls: map[string][]string{}, Roles: map[string]map[string][]string{}, Why: map[string]map[string][]string{}}
	why := map[string]map[string]map[string]bool{}
	for _, fs := range featureSets() {
		doc.Features = append(doc.Features, fs.name)
		for _, v := range privileges.Versions {
			var mu sync.Mutex
			var needs []privileges.Need
			by := map[string][]privileges.Need{}
			e := privEnv(t, v, nil, func(r proxmoxsim.CallRecord) {
				mu.Lock()
				defer mu.Unlock()
				needs = append(append(needs, r.Needs...), r.Filters...)
				by[r.Method+" "+r.Path] = append(append(by[r.Method+" "+r.Path], r.Needs...), r.Filters...)
			})
			if err := runFeature(t, e, fs); err != nil {
				t.Fatalf("PVE %d, %s, with an Administrator token: %v", v, fs.name, err)
			}
			calls := map[string]bool{}
			for _, c := range e.obs.snapshot() {
				// A call missing from the table has no privileges anyone
				// derived: the table must grow first.
				if _, ok := privileges.Lookup(c.method, c.endpoint); !ok {
					t.Errorf("PVE %d, %s: %s %s is not in the privilege table (pkg/provider/proxmox/privileges)", v, fs.name, c.method, c.endpoint)
				}
				calls[c.method+" "+c.endpoint] = true
			}
			list := sortedSet(calls)
			if prev, ok := doc.Calls[fs.name]; ok && !slices.Equal(prev, list) {
				t.Errorf("%s calls differ between versions: %v and %v", fs.name, prev, list)
			}
			doc.Calls[fs.name] = list
			key := fmt.Sprint(int(v))
			if doc.Roles[key] == nil {
				doc.Roles[key] = map[string][]string{}
			}
			role := privileges.Role(needs)
			doc.Roles[key][fs.name] = role
			if why[key] == nil {
				why[key] = map[string]map[string]bool{}
			}
			for endpoint, ns := range by {
				for _, n := range ns {
					for _, p := range n.Privs {
						if slices.Contains(role, p) {
							if why[key][p] == nil {
								why[key][p] = map[string]bool{}
							}
							why[key][p][endpoint] = true
						}
					}
				}
			}
		}
	}
	for key, privs := range why {
		doc.Why[key] = map[string][]string{}
		for p, endpoints := range privs {
			doc.Why[key][p] = sortedSet(endpoints)
		}
	}
	return doc
}

func sortedSet(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestMinimalRoles records, for each feature set and Proxmox VE version,
// the calls the provider sends (every one must be a row of the privilege
// table) and the checks the simulator runs for them from that table, and
// derives the minimal roles; testdata/roles.json must hold exactly those
// (go test -run TestMinimalRoles -update-roles rewrites it; make verify
// then regenerates docs/install.md from it).
//
// Mutation: dropping Datastore.Allocate from Content.pm delete's rule
// (privileges/resolve.go Needs) fails this test (the roles drift) and
// TestRolesEnforced (the role is not minimal); so does dropping
// check_drive_perms's check of a drive's old value (configNeeds), or giving
// PVE 9's file-write PVE 8's VM.Monitor (privileges/table.go). Renaming a
// row the provider calls (GET /cluster/status) fails it too: the simulator
// refuses to start with a route the table lacks.
func TestMinimalRoles(t *testing.T) {
	doc := recordRoles(t)
	got, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	if *updateRoles {
		if err := os.WriteFile(rolesFile, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(rolesFile)
	if err != nil {
		t.Fatalf("%v (run go test ./pkg/provider/proxmox -run TestMinimalRoles -update-roles)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is out of date with the recorded calls; run go test ./pkg/provider/proxmox -run TestMinimalRoles -update-roles, then make verify.\ngot:\n%s", rolesFile, got)
	}
}

// TestRolesEnforced gives the operator's token exactly the generated role
// of each feature set on each Proxmox VE version: the VM is created to
// Running, used and deleted. Then each privilege of the role is removed in
// turn: the run fails with a Configuration error that names the privilege
// and the pveum command granting it. The simulator enforces the same table
// the roles came from, so a role and its enforcement cannot drift apart.
//
// Mutation: removing VM.GuestAgent.FileWrite from the PVE 9 base role in
// testdata/roles.json fails PVE9/base (PlaceGuestFile is refused); making
// the simulator skip the table's checks (checkPermissionsLocked with no
// needs) fails every subtest (the runs succeed without a privilege);
// dropping the pveum hint from errors.go's 403 fails every removal.
func TestRolesEnforced(t *testing.T) {
	raw, err := os.ReadFile(rolesFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc rolesDoc
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	sets := map[string]featureSet{}
	for _, fs := range featureSets() {
		sets[fs.name] = fs
	}
	for _, v := range privileges.Versions {
		for _, name := range doc.Features {
			roles := doc.Roles[fmt.Sprint(int(v))]
			fs, own := sets[name], roles[name]
			// The cluster's role: base's and the feature's.
			role := slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(roles["base"]), own...))))
			t.Run(fmt.Sprintf("PVE%d/%s", v, name), func(t *testing.T) {
				if len(own) == 0 {
					t.Fatal("no role recorded")
				}
				if err := runFeature(t, privEnv(t, v, role, nil), fs); err != nil {
					t.Fatalf("with the generated role %v: %v", role, err)
				}
				// Each privilege the feature set's own calls need is
				// necessary: without it the run fails, naming it.
				for _, priv := range own {
					less := slices.DeleteFunc(slices.Clone(role), func(p string) bool { return p == priv })
					err := runFeature(t, privEnv(t, v, less, nil), fs)
					if err == nil {
						t.Errorf("without %s the run succeeded: the role is not minimal", priv)
						continue
					}
					t.Logf("without %s: %v", priv, err)
					if provider.Classify(err) != provider.ClassConfiguration || !strings.Contains(err.Error(), priv) || !strings.Contains(err.Error(), privileges.Fix(priv)) {
						t.Errorf("without %s: %v (class %s); want a Configuration error naming %s and %q", priv, err, provider.Classify(err), priv, privileges.Fix(priv))
					}
				}
			})
		}
	}
}

// TestPermissionDeniedMessage: a 403 names what is missing, where, and the
// pveum command that grants it; an any-of refusal names every alternative
// and grants the first; a refusal without a privilege keeps the general
// hint.
//
// Mutation: permissionFix granting privs[len(privs)-1] fails the any-of
// case.
func TestPermissionDeniedMessage(t *testing.T) {
	for reason, want := range map[string][]string{
		"Permission check failed (/vms/1000, VM.Config.Cloudinit)": {"PermissionDenied",
			"lacks VM.Config.Cloudinit on /vms/1000", "grant it: pveum role modify HyperFleet --append --privs VM.Config.Cloudinit"},
		"Permission check failed (/vms/1000, VM.GuestAgent.FileWrite|VM.GuestAgent.Unrestricted)": {
			"lacks any of VM.GuestAgent.FileWrite, VM.GuestAgent.Unrestricted on /vms/1000", "--privs VM.GuestAgent.FileWrite "},
		"Permission check failed (user != root@pam)": {"grant the named privilege on the named path"},
	} {
		err := httpError(&exchange{code: 403, reason: reason}, "PUT", "/nodes/{node}/qemu/{vmid}/config")
		if provider.Classify(err) != provider.ClassConfiguration || provider.ReasonOf(err) != "PermissionDenied" {
			t.Errorf("%s: %v (%s)", reason, err, provider.Classify(err))
		}
		for _, w := range want {
			if !strings.Contains(err.Error()+" ", w) && w != "PermissionDenied" {
				t.Errorf("%s: %q lacks %q", reason, err, w)
			}
		}
	}
	// A clone's 'or' group fails bare (RPCEnvironment.pm
	// exec_api2_perm_check); the table names what it checks.
	err := httpError(&exchange{code: 403, reason: "Permission check failed"}, "POST", "/nodes/{node}/qemu/{vmid}/clone")
	if w := "lacks VM.Allocate on /vms/{newid} (or on /pool/{pool}); grant it: pveum role modify HyperFleet --append --privs VM.Allocate"; !strings.Contains(err.Error(), w) {
		t.Errorf("bare clone refusal: %q lacks %q", err, w)
	}
}
