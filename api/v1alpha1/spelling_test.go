package v1alpha1_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/utils/ptr"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// oldKeys are the seventeen keys spelt ...Id before every id was spelt ID.
var oldKeys = []string{"templateId", "appId", "installationId", "vmId", "tokenId", "jobId", "runId", "runnerId",
	"lastDeliveryId", "spiffeId", "nodeId", "entryId", "keyId"}

// respellCase is one struct family: a document with the old keys only,
// what it must decode to, and the keys its encoding must hold.
type respellCase struct {
	old     string
	into    func() any
	want    any
	newKeys []string
}

var respellCases = map[string]respellCase{
	"ProxmoxSource": {
		old:     `{"templateId":9000,"cloneMode":"linked"}`,
		into:    func() any { return &hfv1.ProxmoxSource{} },
		want:    &hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9000), CloneMode: "linked"},
		newKeys: []string{"templateID"},
	},
	"GitHubAppCredentials": {
		old:  `{"appId":{"name":"gh","key":"id"},"installationId":{"name":"gh","key":"inst"},"privateKey":{"name":"gh","key":"pem"}}`,
		into: func() any { return &hfv1.GitHubAppCredentials{} },
		want: &hfv1.GitHubAppCredentials{AppID: hfv1.LocalSecretKeySelector{Name: "gh", Key: "id"},
			InstallationID: hfv1.LocalSecretKeySelector{Name: "gh", Key: "inst"}, PrivateKey: hfv1.LocalSecretKeySelector{Name: "gh", Key: "pem"}},
		newKeys: []string{"appID", "installationID"},
	},
	"ResolvedTemplate": {
		old:     `{"vmId":9000,"node":"pve1"}`,
		into:    func() any { return &hfv1.ResolvedTemplate{} },
		want:    &hfv1.ResolvedTemplate{VMID: 9000, Node: "pve1"},
		newKeys: []string{"vmID"},
	},
	"HypervisorCredentials": {
		old:     `{"tokenId":{"namespace":"hf","name":"pve","key":"tokenId"},"tokenSecret":{"namespace":"hf","name":"pve","key":"s"}}`,
		into:    func() any { return &hfv1.HypervisorCredentials{} },
		want:    &hfv1.HypervisorCredentials{TokenID: &hfv1.SecretKeySelector{Namespace: "hf", Name: "pve", Key: "tokenId"}, TokenSecret: &hfv1.SecretKeySelector{Namespace: "hf", Name: "pve", Key: "s"}},
		newKeys: []string{"tokenID"},
	},
	"CIJob": {
		old:  `{"spec":{"platform":"github-actions","jobId":4242,"runId":777,"repository":"o/r","runnerPoolRef":{"name":"p"}},"status":{"state":"in_progress","runnerId":23,"lastDeliveryId":"d-1"}}`,
		into: func() any { return &hfv1.CIJob{} },
		want: &hfv1.CIJob{Spec: hfv1.CIJobSpec{Platform: hfv1.WorkloadGitHubActions, JobID: 4242, RunID: 777, Repository: "o/r", RunnerPoolRef: hfv1.ObjectName{Name: "p"}},
			Status: hfv1.CIJobStatus{State: hfv1.CIJobInProgress, RunnerID: 23, LastDeliveryID: "d-1"}},
		newKeys: []string{"jobID", "runID", "runnerID", "lastDeliveryID"},
	},
	"MachineClaimStatus": {
		old: `{"vmRef":{"hypervisorCluster":"pve","vmId":1234,"node":"pve1"},` +
			`"bootstrap":{"runnerName":"r","runnerId":7,"spiffeId":"spiffe://td/vm/a","jobId":42},` +
			`"identity":{"spiffeId":"spiffe://td/vm/a","nodeId":"spiffe://td/hyperfleet/node/a","entryId":"hyperfleet.u","keyId":2}}`,
		into: func() any { return &hfv1.MachineClaimStatus{} },
		want: &hfv1.MachineClaimStatus{
			VMRef:     &hfv1.VMReference{HypervisorCluster: "pve", VMID: 1234, Node: "pve1"},
			Bootstrap: &hfv1.BootstrapStatus{RunnerName: "r", RunnerID: 7, SPIFFEID: "spiffe://td/vm/a", JobID: 42},
			Identity:  &hfv1.IdentityStatus{SPIFFEID: "spiffe://td/vm/a", NodeID: "spiffe://td/hyperfleet/node/a", EntryID: "hyperfleet.u", KeyID: ptr.To[int32](2)},
		},
		newKeys: []string{"vmID", "runnerID", "spiffeID", "jobID", "nodeID", "entryID", "keyID"},
	},
}

// TestOldSpellingsDecodeAndEncodeNew: a document with only the ...Id keys
// an earlier operator or user wrote decodes into the Go fields (as the API
// machinery decodes: case-sensitively), and encodes with the ...ID keys
// only, so every write moves them.
func TestOldSpellingsDecodeAndEncodeNew(t *testing.T) {
	for name, tc := range respellCases {
		t.Run(name, func(t *testing.T) {
			got := tc.into()
			if err := utiljson.Unmarshal([]byte(tc.old), got); err != nil {
				t.Fatal(err)
			}
			raw, err := json.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			// The deprecated fields keep what was read (for the event and the
			// status write that moves it); compare what the code reads.
			again := tc.into()
			if err := utiljson.Unmarshal(raw, again); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(again, tc.want) {
				t.Errorf("decoded %s as\n%+v\nwant\n%+v", tc.old, again, tc.want)
			}
			keys := jsonKeys(t, raw)
			for _, k := range oldKeys {
				if keys[k] {
					t.Errorf("encoded with the old key %s: %s", k, raw)
				}
			}
			for _, k := range tc.newKeys {
				if !keys[k] {
					t.Errorf("encoded without %s: %s", k, raw)
				}
			}
		})
	}
}

// TestNewSpellingWins: an object that has both spellings (a stored object
// an earlier operator wrote, moved by a later write that added the new
// key) reads the new one.
func TestNewSpellingWins(t *testing.T) {
	var ref hfv1.VMReference
	if err := utiljson.Unmarshal([]byte(`{"hypervisorCluster":"pve","vmID":200,"vmId":100}`), &ref); err != nil {
		t.Fatal(err)
	}
	if ref.VMID != 200 {
		t.Errorf("vmID 200 beside vmId 100 reads as %d", ref.VMID)
	}
	var cred hfv1.HypervisorCredentials
	if err := utiljson.Unmarshal([]byte(`{"tokenId":{"name":"old"},"tokenID":{"name":"new"}}`), &cred); err != nil {
		t.Fatal(err)
	}
	if cred.TokenID == nil || cred.TokenID.Name != "new" {
		t.Errorf("tokenID beside tokenId reads as %+v", cred.TokenID)
	}
}

// TestOldSpellingsListed: the keys read under their earlier spelling are
// listed where internal/patch moves them (status) and the template's
// DeprecatedField event names them (spec); an object read with the new
// spelling lists none.
func TestOldSpellingsListed(t *testing.T) {
	var claim hfv1.MachineClaim
	if err := utiljson.Unmarshal([]byte(`{"status":`+respellCases["MachineClaimStatus"].old+`}`), &claim); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range claim.OldStatusSpellings() {
		got = append(got, strings.Join(o.Path, ".")+"."+o.Old+">"+o.New)
	}
	want := []string{"status.vmRef.vmId>vmID", "status.bootstrap.runnerId>runnerID", "status.bootstrap.spiffeId>spiffeID",
		"status.bootstrap.jobId>jobID", "status.identity.spiffeId>spiffeID", "status.identity.nodeId>nodeID",
		"status.identity.entryId>entryID", "status.identity.keyId>keyID"}
	if !slices.Equal(got, want) {
		t.Errorf("claim lists %q, want %q", got, want)
	}
	raw, err := json.Marshal(&claim)
	if err != nil {
		t.Fatal(err)
	}
	var moved hfv1.MachineClaim
	if err := utiljson.Unmarshal(raw, &moved); err != nil {
		t.Fatal(err)
	}
	if l := moved.OldStatusSpellings(); len(l) != 0 {
		t.Errorf("a claim written with the new spelling lists %v", l)
	}

	var tmpl hfv1.HypervisorMachineTemplate
	doc := `{"spec":{"source":{"proxmox":{"templateId":9000}},"bootstrap":{"github":{"credentials":{"app":` +
		`{"appId":{"name":"gh","key":"id"},"installationId":{"name":"gh","key":"inst"},"privateKey":{"name":"gh","key":"pem"}}}}}},` +
		`"status":{"resolvedTemplate":{"vmId":9000}}}`
	if err := utiljson.Unmarshal([]byte(doc), &tmpl); err != nil {
		t.Fatal(err)
	}
	got = nil
	for _, o := range tmpl.OldSpecSpellings() {
		got = append(got, strings.Join(o.Path, ".")+"."+o.Old+">"+o.New)
	}
	want = []string{"spec.source.proxmox.templateId>templateID", "spec.bootstrap.github.credentials.app.appId>appID",
		"spec.bootstrap.github.credentials.app.installationId>installationID"}
	if !slices.Equal(got, want) {
		t.Errorf("template spec lists %q, want %q", got, want)
	}
	if l := tmpl.OldStatusSpellings(); len(l) != 1 || l[0].Old != "vmId" || l[0].New != "vmID" {
		t.Errorf("template status lists %v, want resolvedTemplate's vmId", l)
	}
}

// TestNoIdSpelling: no JSON field of the API is spelt ...Id except the
// deprecated spellings, so a new field cannot bring the old form back.
func TestNoIdSpelling(t *testing.T) {
	seen := map[reflect.Type]bool{}
	var walk func(t2 reflect.Type, path string)
	walk = func(t2 reflect.Type, path string) {
		for t2.Kind() == reflect.Pointer || t2.Kind() == reflect.Slice || t2.Kind() == reflect.Map {
			t2 = t2.Elem()
		}
		if t2.Kind() != reflect.Struct || seen[t2] || t2.PkgPath() != reflect.TypeFor[hfv1.MachineClaim]().PkgPath() {
			return
		}
		seen[t2] = true
		for i := range t2.NumField() {
			f := t2.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if strings.HasSuffix(name, "Id") && !strings.HasPrefix(f.Name, "Deprecated") {
				t.Errorf("%s.%s is spelt %s: spell it %sID", path, f.Name, name, strings.TrimSuffix(name, "Id"))
			}
			walk(f.Type, path+"."+f.Name)
		}
	}
	for _, root := range []any{hfv1.CIJob{}, hfv1.HypervisorCluster{}, hfv1.HypervisorMachineTemplate{}, hfv1.IPPool{}, hfv1.MachineClaim{}, hfv1.RunnerPool{}} {
		walk(reflect.TypeOf(root), reflect.TypeOf(root).Name())
	}
}

func jsonKeys(t *testing.T, raw []byte) map[string]bool {
	t.Helper()
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				keys[k] = true
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(doc)
	return keys
}

// TestOldSpellingsThroughUnstructured: the unstructured converter (dynamic
// clients, kubectl-hyperfleet's reads) folds and writes the same way as the
// JSON decoder, since it goes through UnmarshalJSON and MarshalJSON.
func TestOldSpellingsThroughUnstructured(t *testing.T) {
	u := map[string]any{"spec": map[string]any{"platform": "github-actions", "jobId": int64(4242), "repository": "o/r",
		"runnerPoolRef": map[string]any{"name": "p"}}}
	var job hfv1.CIJob
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u, &job); err != nil {
		t.Fatal(err)
	}
	if job.Spec.JobID != 4242 {
		t.Fatalf("jobId converts to JobID %d", job.Spec.JobID)
	}
	back, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&job)
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := back["spec"].(map[string]any)
	if _, old := spec["jobId"]; old || spec["jobID"] != int64(4242) {
		t.Errorf("converted back to %v, want jobID only", spec)
	}
}
