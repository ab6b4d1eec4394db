package cloudinit

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"
	"pgregory.net/rapid"

	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
)

func newRand(t testing.TB, seed uint64) *rand.Rand {
	t.Helper()
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

func itoa(i int) string { return strconv.Itoa(i) }

// intner is where the generators below take their choices from: a seeded
// *rand.Rand, or rapid through proptest.Draws (then rapid shrinks a failing
// case's choices towards zero: fewer keys, shallower values).
type intner interface{ IntN(n int) int }

// ---- Property test of the merge against a reference model ----

// Keys the random configs draw from; small pools make both sides collide.
var (
	randTopKeys  = []string{"runcmd", "write_files", "packages", "bootcmd", "ssh_authorized_keys", "apt", "ntp", "manage_etc_hosts", "hostname", "fqdn", "power_state", "timezone", "x_a", "x_b"}
	randNestKeys = []string{"a", "b", "c", "sources", "servers"}
	testPolicy   = &mergePolicy{
		reserved:   map[string]string{"hostname": "test", "fqdn": "test", "power_state": "test"},
		defaults:   map[string]bool{"manage_etc_hosts": true},
		ownedPaths: map[string]bool{"/etc/hyperfleet/agent.json": true},
	}
)

func randScalar(r intner) any {
	switch r.IntN(4) {
	case 0:
		return r.IntN(1000)
	case 1:
		return r.IntN(2) == 0
	default:
		return []string{"docker.io", "echo hi", "/etc/motd", "0644", "on", "x y"}[r.IntN(6)]
	}
}

func randValue(r intner, depth int) any {
	switch k := r.IntN(6); {
	case k < 2 || depth > 2:
		return randScalar(r)
	case k < 4:
		var l []any
		for range r.IntN(4) {
			if r.IntN(4) == 0 && depth < 2 {
				l = append(l, randMap(r, depth+1))
			} else {
				l = append(l, randScalar(r))
			}
		}
		return l
	default:
		return randMap(r, depth+1)
	}
}

func randMap(r intner, depth int) map[string]any {
	m := map[string]any{}
	for range r.IntN(4) {
		m[randNestKeys[r.IntN(len(randNestKeys))]] = randValue(r, depth)
	}
	return m
}

func randTop(r intner, operator bool) map[string]any {
	m := map[string]any{}
	for range r.IntN(7) {
		k := randTopKeys[r.IntN(len(randTopKeys))]
		switch {
		case k == "write_files":
			var files []any
			for range 1 + r.IntN(2) {
				p := "/etc/file-" + itoa(r.IntN(3))
				if !operator && r.IntN(8) == 0 {
					p = "/etc/hyperfleet/agent.json"
				}
				files = append(files, map[string]any{"path": p, "content": "x"})
			}
			m[k] = files
		case (k == "hostname" || k == "fqdn" || k == "power_state") && !operator && r.IntN(3) != 0:
			// Reserved keys appear in a third of the draws only.
		default:
			m[k] = randValue(r, 0)
		}
	}
	return m
}

// refMerge is the reference model of the merge rules, on plain values.
func refMerge(u, o map[string]any, top bool) (map[string]any, string) {
	out := map[string]any{}
	for k, v := range u {
		out[k] = v
	}
	for k, ov := range o {
		uv, ok := u[k]
		if !ok || uv == nil {
			out[k] = ov
			continue
		}
		if top && testPolicy.defaults[k] {
			continue
		}
		ul, uIsList := uv.([]any)
		ol, oIsList := ov.([]any)
		um, uIsMap := uv.(map[string]any)
		om, oIsMap := ov.(map[string]any)
		switch {
		case uIsList && oIsList:
			out[k] = append(append([]any{}, ul...), ol...)
		case uIsMap && oIsMap:
			m, conflict := refMerge(um, om, false)
			if conflict != "" {
				return nil, k + "." + conflict
			}
			out[k] = m
		default:
			return nil, k
		}
	}
	return out, ""
}

// refConflict predicts the error the merge must report, or "".
func refConflict(u, o map[string]any) string {
	for k := range u {
		if _, ok := testPolicy.reserved[k]; ok {
			return "reserved"
		}
	}
	if files, ok := u["write_files"].([]any); ok {
		for _, f := range files {
			if m, ok := f.(map[string]any); ok && testPolicy.ownedPaths[fmt.Sprint(m["path"])] {
				return "path"
			}
		}
	}
	if _, c := refMerge(u, o, true); c != "" {
		return "conflict"
	}
	return ""
}

func toNode(t interface {
	Helper()
	Fatal(...any)
}, v any) *yaml.Node {
	t.Helper()
	var n yaml.Node
	if err := n.Encode(v); err != nil {
		t.Fatal(err)
	}
	return &n
}

// Feature: hyperfleet-operator, Property 5: Cloud-Init Data Merging
//
// TestMergeProperties draws user and operator configs (rapid; 3,000 cases) and checks
// the merge against refMerge: a merge that succeeds never loses a user key
// or value, never changes an operator value except a default the user set,
// puts the user's list items before the operator's, and fails exactly when
// the rules say it must, naming the key.
func TestMergeProperties(t *testing.T) {
	var ok, conflicts int
	proptest.Check(t, 3000, func(rt *rapid.T) {
		r := proptest.Draws{T: rt}
		u, o := randTop(r, false), randTop(r, true)
		text, err := yaml.Marshal(u)
		if err != nil {
			rt.Fatal(err)
		}
		// The user's values as yaml.v3 reads them back (same types as the
		// merged output decodes to).
		var uBack map[string]any
		if err := yaml.Unmarshal(text, &uBack); err != nil {
			rt.Fatal(err)
		}
		if uBack == nil {
			uBack = map[string]any{}
		}
		var oBack map[string]any
		ob, _ := yaml.Marshal(o)
		if err := yaml.Unmarshal(ob, &oBack); err != nil {
			rt.Fatal(err)
		}
		if oBack == nil {
			oBack = map[string]any{}
		}

		merged, err := mergeCloudConfig(text, toNode(rt, o), testPolicy)
		want := refConflict(uBack, oBack)
		if want != "" {
			conflicts++
			var e *Error
			if err == nil || !errors.As(err, &e) || e.Field != FieldUserData {
				rt.Fatalf("want a %s error from the merge, got %v\nuser: %v\noperator: %v", want, err, uBack, oBack)
			}
			return
		}
		if err != nil {
			rt.Fatalf("unexpected error %v\nuser: %v\noperator: %v", err, uBack, oBack)
		}
		ok++
		out, err := encodeYAML(merged)
		if err != nil {
			rt.Fatal(err)
		}
		var got map[string]any
		if err := yaml.Unmarshal(out, &got); err != nil {
			rt.Fatalf("merged output does not parse: %v\n%s", err, out)
		}
		if got == nil {
			got = map[string]any{}
		}
		ref, _ := refMerge(uBack, oBack, true)
		if !reflect.DeepEqual(got, ref) {
			rt.Fatalf("merge differs from the reference\nuser: %v\noperator: %v\ngot:  %v\nwant: %v", uBack, oBack, got, ref)
		}
		// The properties spelled out, independent of refMerge.
		for k, uv := range uBack {
			gv, present := got[k]
			if !present {
				rt.Fatalf("user key %q lost", k)
			}
			if ul, isList := uv.([]any); isList {
				gl, _ := gv.([]any)
				if len(gl) < len(ul) || !reflect.DeepEqual(gl[:len(ul)], ul) {
					rt.Fatalf("user list %q = %v does not start with the user's items %v", k, gv, ul)
				}
			} else if _, isMap := uv.(map[string]any); !isMap && uv != nil && !reflect.DeepEqual(gv, uv) {
				rt.Fatalf("user value %q changed from %v to %v", k, uv, gv)
			}
		}
		for k, ov := range oBack {
			if testPolicy.defaults[k] && uBack[k] != nil {
				continue
			}
			gv := got[k]
			if ol, isList := ov.([]any); isList {
				gl, _ := gv.([]any)
				if len(gl) < len(ol) || !reflect.DeepEqual(gl[len(gl)-len(ol):], ol) {
					rt.Fatalf("operator list %q = %v does not end with the operator's items %v", k, gv, ol)
				}
			} else if _, isMap := ov.(map[string]any); !isMap && !reflect.DeepEqual(gv, ov) {
				rt.Fatalf("operator value %q changed from %v to %v", k, ov, gv)
			}
		}
	})
	// Each side a tenth of the cases at least (rapid runs a fifth of them
	// under -short, as in the race run).
	if n := ok + conflicts; ok < n/10 || conflicts < n/10 {
		t.Fatalf("the generator is unbalanced: %d merges, %d conflicts", ok, conflicts)
	}
}

func TestMergeErrors(t *testing.T) {
	v := baseVars()
	for _, tc := range []struct {
		name, userData string
		want           []string
	}{
		{"reserved hostname", "#cloud-config\npackages: [git]\nhostname: mine\n", []string{FieldUserData, "line 3", `"hostname" is reserved`}},
		{"reserved power_state", "#cloud-config\npower_state: {mode: reboot}\n", []string{`"power_state" is reserved`}},
		{"runcmd scalar", "#cloud-config\nruncmd: echo hi\n", []string{`"runcmd" is also set by HyperFleet`, "only lists and mappings are merged"}},
		{"owned path", "#cloud-config\nwrite_files:\n  - path: /etc/hyperfleet/../hyperfleet/agent.json\n    content: x\n", []string{"line 3", "written by HyperFleet"}},
		{"duplicate key", "#cloud-config\nruncmd: []\nruncmd: []\n", []string{`"runcmd" is set twice (first on line 2)`}},
		{"not a mapping", "#cloud-config\n- a\n- b\n", []string{"must be a YAML mapping"}},
		{"two documents", "#cloud-config\na: 1\n---\nb: 2\n", []string{"more than one YAML document"}},
		{"bad yaml", "#cloud-config\na: [1\n", []string{FieldUserData, "invalid YAML"}},
		{"merge key", "#cloud-config\nbase: &b {hostname: x}\n<<: *b\n", []string{"merge keys (<<)"}},
		{"unknown header", "just text\n", []string{"line 1", "must start with #cloud-config"}},
		{"mime reserved", "Content-Type: multipart/mixed; boundary=\"B\"\nMIME-Version: 1.0\n\n--B\nContent-Type: text/cloud-config\n\n#cloud-config\nfqdn: x.example\n--B--\n", []string{"MIME part 1", `"fqdn" is reserved`}},
		{"mime null runcmd", "Content-Type: multipart/mixed; boundary=\"B\"\nMIME-Version: 1.0\n\n--B\nContent-Type: text/cloud-config\n\n#cloud-config\nruncmd:\n--B--\n", []string{"MIME part 1", `"runcmd" is null`}},
		{"mime base64 conflict", "Content-Type: multipart/mixed; boundary=\"B\"\nMIME-Version: 1.0\n\n--B\nContent-Type: text/cloud-config\nContent-Transfer-Encoding: base64\n\nI2Nsb3VkLWNvbmZpZwp3cml0ZV9maWxlczogbm9uZQo=\n--B--\n", []string{"MIME part 1", `"write_files" is also set`}},
		{"mime not multipart", "Content-Type: text/plain\n\nhello\n", []string{"must be multipart/mixed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Render(Input{Vars: v, UserData: tc.userData})
			if err == nil {
				t.Fatal("Render succeeded, want an error")
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Errorf("error %v is not an *Error", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestMergeKeepsUserFormatting(t *testing.T) {
	v := baseVars()
	out, err := Render(Input{Vars: v, UserData: "#cloud-config\n# keep me\nruncmd:\n  - echo one # trailing\nmanage_etc_hosts: localhost\nruncmd_alias: &cmds [a]\nbootcmd: *cmds\nmode: 0600\nflag: on\n"})
	if err != nil {
		t.Fatal(err)
	}
	s := string(out.UserData)
	for _, want := range []string{"# keep me", "echo one # trailing", "manage_etc_hosts: localhost", "mode: 0600", "flag: on", "runcmd_alias: &cmds [a]"} {
		if !strings.Contains(s, want) {
			t.Errorf("merged user-data lost %q:\n%s", want, s)
		}
	}
	if strings.Count(s, "manage_etc_hosts") != 1 {
		t.Errorf("manage_etc_hosts appears more than once:\n%s", s)
	}
	if !strings.HasPrefix(s, "#cloud-config\n") {
		t.Errorf("merged user-data does not start with #cloud-config:\n%s", s)
	}
}

// ---- Random user cloud-configs full of YAML 1.1 traps, as text ----

// trapScalars are plain (and a few quoted or tagged) scalars whose meaning
// differs between YAML 1.1 (PyYAML, cloud-init) and YAML 1.2 (yaml.v3), or
// that need care when written back.
var trapScalars = []string{
	"on", "off", "yes", "No", "y", "n", "true", "False", "~", "null",
	"0600", "0o17", "0x1F", "1_000", "+12", "-0", "1:20", "12:30:45", "52:54:00:12:34:56",
	"2025-01-01", "2025-01-01 10:00:00", "1e3", "1.5e3", ".5", ".inf", "-.inf", ".nan",
	"2001:db8::1", "192.0.2.1/24", "plain text", "value # comment", "http://x.example/a?b=c",
	"'single ''quoted'''", `"double \"quoted\" \t tab"`, "'#not a comment'", "!!str 0600", "!!binary aGVsbG8=",
	`"unicode é ✓"`,
}

// flowTraps are the trap scalars that may stand inside [ ].
var flowTraps = func() []string {
	var out []string
	for _, s := range trapScalars {
		if !strings.Contains(s, "#") && !strings.Contains(s, "://") {
			out = append(out, s)
		}
	}
	return out
}()

func randFlowTrap(r intner) string { return flowTraps[r.IntN(len(flowTraps))] }

func randTrap(r intner) string { return trapScalars[r.IntN(len(trapScalars))] }

func writeRandValue(b *strings.Builder, r intner, indent, depth int) {
	pad := strings.Repeat(" ", indent+2)
	switch k := r.IntN(7); {
	case k < 3 || depth > 2:
		b.WriteString(" " + randTrap(r) + "\n")
	case k == 3:
		b.WriteString(" [" + randFlowTrap(r) + ", " + randFlowTrap(r) + "]\n")
	case k == 4:
		b.WriteString(" |\n")
		lines := []string{"echo hi", "  indented", "trailing space ", "", "a: b", "# not a comment"}
		b.WriteString(pad + "first line\n")
		for range r.IntN(4) {
			if l := lines[r.IntN(len(lines))]; l == "" {
				b.WriteString("\n")
			} else {
				b.WriteString(pad + l + "\n")
			}
		}
	case k == 5:
		b.WriteString("\n")
		for range 1 + r.IntN(3) {
			b.WriteString(pad + "-")
			writeRandValue(b, r, indent+2, depth+1)
		}
	default:
		b.WriteString("\n")
		for j := range 1 + r.IntN(3) {
			b.WriteString(pad + "k" + itoa(j) + ":")
			writeRandValue(b, r, indent+2, depth+1)
		}
	}
}

// randomUserCloudConfig writes a conflict-free user #cloud-config: lists
// for the operator's list keys, anything elsewhere.
func randomUserCloudConfig(r intner) string {
	var b strings.Builder
	b.WriteString("#cloud-config\n")
	if r.IntN(3) == 0 {
		b.WriteString("# a comment\n")
	}
	used := map[string]bool{}
	anchored := false
	for range 1 + r.IntN(6) {
		keys := []string{"runcmd", "write_files", "bootcmd", "packages", "manage_etc_hosts", "x_a", "x_b", "x_c", "timezone"}
		k := keys[r.IntN(len(keys))]
		if used[k] {
			continue
		}
		used[k] = true
		switch k {
		case "runcmd", "bootcmd", "packages":
			if anchored && r.IntN(3) == 0 {
				b.WriteString(k + ": *list\n")
				continue
			}
			b.WriteString(k + ":\n")
			for range 1 + r.IntN(3) {
				if r.IntN(2) == 0 {
					b.WriteString("  - [sh, -c, " + randFlowTrap(r) + "]\n")
				} else {
					b.WriteString("  - " + randTrap(r) + "\n")
				}
			}
		case "write_files":
			b.WriteString("write_files:\n")
			for j := range 1 + r.IntN(2) {
				b.WriteString("  - path: /etc/user-" + itoa(j) + "\n    permissions: " + randTrap(r) + "\n    content:")
				writeRandValue(&b, r, 4, 2)
			}
		default:
			if !anchored && r.IntN(3) == 0 {
				b.WriteString(k + ": &list [" + randFlowTrap(r) + "]\n")
				anchored = true
				continue
			}
			b.WriteString(k + ":")
			writeRandValue(&b, r, 0, 0)
		}
	}
	return b.String()
}

func TestRandomUserCloudConfigsParse(t *testing.T) {
	// The generator must produce valid YAML, or the cloud-init comparison
	// would test nothing.
	r := newRand(t, 7)
	for i := range 150 {
		doc := randomUserCloudConfig(r)
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("doc %d does not parse: %v\n%s", i, err, doc)
		}
	}
}

// ---- Fuzzing the user-data path ----

func FuzzUserData(f *testing.F) {
	for _, s := range []string{
		mergeUserData, mimeUserData, seedUserData,
		"#cloud-config\nruncmd: [a]\n", "#!/bin/sh\necho\n", "", "#cloud-config\n",
		"#cloud-config\n{a: &x [1], b: *x}\n", "#include\nhttps://example.com/x\n",
		"## template: jinja\n#cloud-config\n", "Content-Type: multipart/mixed; boundary=x\n\n--x\n\n--x--\n",
	} {
		f.Add(s)
	}
	v := baseVars()
	f.Fuzz(func(t *testing.T, user string) {
		op, err := operatorCloudConfig(&v)
		if err != nil {
			t.Fatal(err)
		}
		out, err := buildUserData([]byte(user), op)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Field != FieldUserData {
				t.Fatalf("error is not an *Error about %s: %v", FieldUserData, err)
			}
			return
		}
		s := string(out)
		switch {
		case strings.HasPrefix(s, "#cloud-config\n"):
			var got map[string]any
			if err := yaml.Unmarshal(out, &got); err != nil {
				t.Fatalf("merged output does not parse: %v\n%s", err, out)
			}
			runcmd, _ := got["runcmd"].([]any)
			if len(runcmd) == 0 || fmt.Sprint(runcmd[len(runcmd)-1]) != "[systemctl start --no-block hyperfleet-agent.service]" {
				t.Fatalf("agent start is not the last runcmd entry:\n%s", out)
			}
			if strings.Count(s, "path: "+AgentConfigPath) != 1 {
				t.Fatalf("the agent config is not written exactly once:\n%s", out)
			}
			// Every key of a user #cloud-config survives.
			if k, _, _ := userDataKind([]byte(user)); k == "text/cloud-config" {
				var u map[string]any
				if yaml.Unmarshal(blankFirstLine([]byte(user)), &u) == nil {
					for key := range u {
						if _, ok := got[key]; !ok {
							t.Fatalf("user key %q lost:\n%s", key, out)
						}
					}
				}
			}
		case strings.HasPrefix(s, "Content-Type: multipart/mixed; boundary="):
			if !strings.Contains(s, "Merge-Type: "+MergeType) {
				t.Fatalf("multipart output lacks the operator part:\n%s", out)
			}
		default:
			t.Fatalf("output is neither a cloud-config nor a MIME document:\n%s", out)
		}
	})
}
