package cloudinit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// These tests hand every golden seed to Debian's cloud-init (package
// cloud-init, 22.4.2 on Debian 12 when written): its user-data processor
// (MIME parts and cloud-config merging, cloudinit.user_data and
// cloudinit.handlers.cloud_config), its schema validator (the functions
// cloud-init schema --config-file calls), its NoCloud seed reader
// (util.pathprefix2dict, util.load_yaml) and its network-config converters
// (the handler of cloud-init devel net-convert, to networkd and eni, the
// renderers of Debian images). They run in one Python process per test
// rather than one cloud-init command per file: importing cloud-init costs
// seconds of CPU each time, which a 2-core CI machine cannot spare.
// cloud-init 22.4's schema command validates cloud-config only (it has no
// --schema-type option), so for network-config the converters, which parse
// the document into cloud-init's network state, are the check.

// cloudInit finds the cloud-init command and the Python interpreter it runs
// on. A missing cloud-init fails the test: rendered output must pass the
// real validator, since only cloud-init's own parser says what a VM will do
// with the seed (docs/architecture.md, "Cloud-init on a NoCloud ISO").
func cloudInit(t *testing.T) (bin, python string) {
	t.Helper()
	bin, err := exec.LookPath("cloud-init")
	if err != nil {
		t.Fatalf("cloud-init is not installed: this test validates the rendered seeds with the real cloud-init; install Debian's package: apt-get update && apt-get install -y cloud-init (%v)", err)
	}
	f, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	first, _ := bufio.NewReader(f).ReadString('\n')
	python = strings.TrimSpace(strings.TrimPrefix(first, "#!"))
	if fields := strings.Fields(python); len(fields) > 0 {
		python = fields[0]
	}
	if !strings.HasPrefix(first, "#!") || python == "" {
		t.Fatalf("cannot find the Python interpreter of %s (first line %q); is it Debian's cloud-init package?", bin, first)
	}
	return bin, python
}

// cloudInitView is the Python helper: for each request it reads user-data
// the way cloud-init does (UserDataProcessor, then the cloud-config part
// handler's merge of every text/cloud-config part with its Merge-Type),
// writes the merged cloud-config to mergedOut for the schema validator, and
// reads a seed directory the way the NoCloud datasource does. cloud-init's
// own warnings (a part it failed to merge, say) are returned so the test
// can fail on them.
const cloudInitView = `
import json, logging, sys, tempfile

# cloud-init prints notes (schema deprecations, say) on stdout; the results
# go to the real stdout as one JSON document.
results_out, sys.stdout = sys.stdout, sys.stderr

warnings = []
class Collect(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            warnings.append(record.getMessage())
logging.getLogger().addHandler(Collect())
logging.getLogger().setLevel(logging.WARNING)

from cloudinit import helpers, user_data, util, safeyaml
from cloudinit.cmd.devel import net_convert
from cloudinit.config import schema as ci_schema
from cloudinit.handlers import cloud_config

full_schema = None

def schema_check(path):
    # What "cloud-init schema --config-file PATH" runs (handle_schema_args).
    global full_schema
    if full_schema is None:
        full_schema = ci_schema.get_schema()
    try:
        ci_schema.validate_cloudconfig_file(path, full_schema)
    except Exception as e:
        return '%s: %s' % (type(e).__name__, e)
    return ''

def convert(path, renderer, directory):
    # What "cloud-init devel net-convert" runs, with the same arguments.
    args = net_convert.get_parser().parse_args([
        '--network-data', path, '--kind', 'yaml', '--directory', directory,
        '--distro', 'debian', '--output-kind', renderer])
    try:
        net_convert.handle_args('net-convert', args)
    except Exception as e:
        return '%s: %s' % (type(e).__name__, e)
    finally:
        args.network_data.close()
    return ''

def view(path, merged_out):
    raw = open(path, 'rb').read()
    tmp = tempfile.mkdtemp()
    paths = helpers.Paths({'cloud_dir': tmp, 'run_dir': tmp})
    msg = user_data.UserDataProcessor(paths).process(raw)
    handler = cloud_config.CloudConfigPartHandler(paths)
    handler.cloud_buf = {}
    parts = []
    for part in msg.walk():
        if part.is_multipart():
            continue
        ctype = part.get_content_type()
        payload = util.decode_binary(part.get_payload(decode=True))
        parts.append(ctype)
        if ctype == 'text/cloud-config':
            handler._merge_part(payload, dict(part))
    with open(merged_out, 'w') as f:
        f.write('#cloud-config\n' + safeyaml.dumps(handler.cloud_buf))
    return {'parts': parts, 'config': handler.cloud_buf}

def typed(v):
    # Every scalar as "type:repr", so that 80 and 80.0, NaN and strings
    # compare exactly once in Go.
    if isinstance(v, dict):
        return {str(k): typed(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [typed(x) for x in v]
    return '%s:%r' % (type(v).__name__, v)

def seed(path):
    d = util.pathprefix2dict(path + '/', required=['user-data', 'meta-data'], optional=['vendor-data', 'network-config'])
    out = {'meta': util.load_yaml(d['meta-data'])}
    if 'network-config' in d:
        out['network'] = util.load_yaml(d['network-config'])
    return out

results = {}
for item in json.load(sys.stdin):
    r = {}
    first_warning = len(warnings)
    try:
        if item.get('userData'):
            r.update(view(item['userData'], item['mergedOut']))
            if item.get('typed'):
                r['config'] = typed(r['config'])
        if item.get('seed'):
            r.update(seed(item['seed']))
    except Exception as e:
        r['error'] = '%s: %s' % (type(e).__name__, e)
    r['schemaErrors'] = {p: schema_check(p) for p in item.get('schema') or []}
    if item.get('netConvert'):
        r['convertErrors'] = {k: convert(item['netConvert'], k, item['netConvertDir'] + '/' + k)
                              for k in ('networkd', 'eni')}
    r['warnings'] = warnings[first_warning:]
    results[item['id']] = r
json.dump({'results': results}, results_out, default=str)
`

type viewRequest struct {
	ID        string `json:"id"`
	UserData  string `json:"userData,omitempty"`
	MergedOut string `json:"mergedOut,omitempty"`
	Seed      string `json:"seed,omitempty"`
	// Typed returns every scalar of the config as "type:repr".
	Typed bool `json:"typed,omitempty"`
	// Schema are cloud-config files for cloud-init's schema validator,
	// checked after MergedOut is written (it may be one of them).
	Schema []string `json:"schema,omitempty"`
	// NetConvert is a network-config file for cloud-init's converters; the
	// networkd and eni renderings go to NetConvertDir/<renderer>.
	NetConvert    string `json:"netConvert,omitempty"`
	NetConvertDir string `json:"netConvertDir,omitempty"`
}

type viewResult struct {
	Error   string         `json:"error"`
	Parts   []string       `json:"parts"`
	Config  map[string]any `json:"config"`
	Meta    map[string]any `json:"meta"`
	Network map[string]any `json:"network"`
	// SchemaErrors maps each Schema file to the validator's error ("" when
	// valid); ConvertErrors maps each renderer to the converter's error.
	SchemaErrors  map[string]string `json:"schemaErrors"`
	ConvertErrors map[string]string `json:"convertErrors"`
	// Warnings are what cloud-init logged at WARNING or above for this
	// request.
	Warnings []string `json:"warnings"`
}

// runView runs the Python helper once for all requests: one interpreter
// that imports cloud-init once, instead of a cloud-init command per file.
// Every failure it reports (an unreadable document, a warning, a schema or
// converter error) fails t.
func runView(t *testing.T, python string, reqs []viewRequest) map[string]viewResult {
	t.Helper()
	script := filepath.Join(t.TempDir(), "view.py")
	if err := os.WriteFile(script, []byte(cloudInitView), 0o600); err != nil {
		t.Fatal(err)
	}
	in, err := json.Marshal(reqs)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, script)
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("cloud-init's user-data processor failed: %v\n%s", err, stderr.String())
	}
	var res struct {
		Results map[string]viewResult `json:"results"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("decode helper output: %v\n%s", err, stdout.String())
	}
	for _, r := range reqs {
		got, ok := res.Results[r.ID]
		if !ok {
			t.Errorf("no result for %s from the cloud-init helper", r.ID)
			continue
		}
		if got.Error != "" {
			t.Errorf("cloud-init cannot read %s: %s", r.UserData+r.Seed, got.Error)
		}
		for _, f := range r.Schema {
			if e, ok := got.SchemaErrors[f]; !ok || e != "" {
				t.Errorf("cloud-init schema --config-file %s: %s", f, e)
			}
		}
		if r.NetConvert != "" {
			for _, renderer := range []string{"networkd", "eni"} {
				if e, ok := got.ConvertErrors[renderer]; !ok || e != "" {
					t.Errorf("cloud-init devel net-convert -O %s on %s: %s", renderer, r.NetConvert, e)
				}
			}
		}
		if len(got.Warnings) > 0 {
			t.Errorf("cloud-init warned on %s:\n%s", r.ID, strings.Join(got.Warnings, "\n"))
		}
	}
	return res.Results
}

// networkdFiles returns the systemd-networkd files cloud-init's converter
// wrote for a request's NetConvertDir, concatenated.
func networkdFiles(t *testing.T, dir string) string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "networkd", "etc/systemd/network/*"))
	if len(files) == 0 {
		t.Errorf("net-convert -O networkd wrote no files under %s", dir)
	}
	var networkd strings.Builder
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		networkd.Write(b)
	}
	return networkd.String()
}

func TestCloudInitValidatesGoldens(t *testing.T) {
	_, python := cloudInit(t)
	// Windows seeds are cloudbase-init's, checked against its format by
	// TestWindowsUserDataIsCloudbaseInitFormat instead.
	cases := slices.DeleteFunc(goldenCases(), func(tc goldenCase) bool { return tc.in.Vars.GuestOS == GuestWindows })
	tmp := t.TempDir()
	var reqs []viewRequest
	for _, tc := range cases {
		dir := filepath.Join("testdata", tc.name)
		for _, f := range goldenFiles {
			if _, err := os.Stat(filepath.Join(dir, f.name)); err != nil {
				t.Fatalf("golden file missing: %v (run the golden test with -update)", err)
			}
		}
		req := viewRequest{
			ID:            tc.name,
			UserData:      filepath.Join(dir, "user-data"),
			MergedOut:     filepath.Join(tmp, tc.name+".cfg"),
			Seed:          dir,
			NetConvert:    filepath.Join(dir, "network-config"),
			NetConvertDir: filepath.Join(tmp, tc.name+"-net"),
		}
		// user-data is schema-valid as one document (when it is one) and
		// as cloud-init merges its parts.
		ud, err := os.ReadFile(req.UserData)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.HasPrefix(ud, []byte(cloudConfigHeader+"\n")) {
			req.Schema = append(req.Schema, req.UserData)
		}
		req.Schema = append(req.Schema, req.MergedOut)
		reqs = append(reqs, req)
	}
	results := runView(t, python, reqs)

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := tc.in.Vars
			res, ok := results[tc.name]
			if !ok {
				t.Fatal("no result from cloud-init's user-data processor")
			}

			if !slices.Equal(res.Parts, tc.userParts) {
				t.Errorf("cloud-init sees parts %v, want %v", res.Parts, tc.userParts)
			}

			// What cloud-init will do with the merged config.
			cfg := res.Config
			if cfg["hostname"] != v.Hostname || cfg["fqdn"] != v.FQDN {
				t.Errorf("hostname/fqdn = %v/%v, want %s/%s", cfg["hostname"], cfg["fqdn"], v.Hostname, v.FQDN)
			}
			runcmd, _ := cfg["runcmd"].([]any)
			want := []any{"systemctl", "start", "--no-block", AgentUnitName}
			if len(runcmd) == 0 || !reflect.DeepEqual(runcmd[len(runcmd)-1], want) {
				t.Errorf("the last runcmd entry is not the agent's start: %v", runcmd)
			}
			var agentFile, unitFile map[string]any
			files, _ := cfg["write_files"].([]any)
			for _, f := range files {
				m, _ := f.(map[string]any)
				switch m["path"] {
				case AgentConfigPath:
					agentFile = m
				case AgentUnitPath:
					unitFile = m
				}
			}
			if agentFile == nil || unitFile == nil {
				t.Fatalf("write_files lacks %s or %s: %v", AgentConfigPath, AgentUnitPath, files)
			}
			if agentFile["permissions"] != "0600" || agentFile["owner"] != "root:root" {
				t.Errorf("agent config is written with permissions %v owner %v, want 0600 root:root", agentFile["permissions"], agentFile["owner"])
			}
			if v.AgentDownloadURL != "" {
				checkAgentDownload(t, v, runcmd, files)
			}
			content, _ := agentFile["content"].(string)
			ac, err := agentconfig.Parse([]byte(content))
			if err != nil {
				t.Errorf("the agent cannot read the config cloud-init writes: %v", err)
			} else if ac.JITConfig != "" || ac.RegistrationToken != "" || (ac.SPIFFE != nil) != v.SPIFFEEnabled ||
				(ac.SecretsFile == agentconfig.SecretsFile) != v.receivesSecrets() || v.receivesSecrets() && !ac.SecretsDeadline.Equal(v.SecretsDeadline.Time) {
				t.Errorf("agent config holds a credential, or does not name where the VM's secrets arrive: %+v", ac)
			}

			// meta-data as NoCloud reads it.
			if res.Meta["instance-id"] != v.InstanceID || res.Meta["local-hostname"] != v.Hostname {
				t.Errorf("meta-data = %v, want instance-id %s local-hostname %s", res.Meta, v.InstanceID, v.Hostname)
			}
			if res.Network == nil {
				t.Error("NoCloud did not read a network-config")
			}

			// network-config through cloud-init's converters.
			networkd := networkdFiles(t, filepath.Join(tmp, tc.name+"-net"))
			for _, line := range tc.networkd {
				if !strings.Contains(networkd, line) {
					t.Errorf("cloud-init's networkd rendering lacks %q:\n%s", line, networkd)
				}
			}
		})
	}
}

// checkAgentDownload checks, in the config cloud-init merged, that the
// agent download (agentSource Operator) runs before the agent's unit is
// loaded and started, and that its script and CA are written.
func checkAgentDownload(t *testing.T, v Vars, runcmd, files []any) {
	t.Helper()
	fetch, reload := -1, -1
	for i, c := range runcmd {
		l, _ := c.([]any)
		switch {
		case len(l) > 6 && l[0] == "sh" && strings.Contains(fmt.Sprint(l[2]), FetchAgentPath):
			if l[4] != v.AgentDownloadURL || l[5] != v.AgentSHA256 || l[6] != AgentBinary {
				t.Errorf("the download's arguments are %v", l[3:])
			}
			fetch = i
		case reflect.DeepEqual(l, []any{"systemctl", "daemon-reload"}):
			reload = i
		}
	}
	if fetch < 0 || reload < 0 || fetch > reload {
		t.Errorf("runcmd does not download the agent before daemon-reload: %v", runcmd)
	}
	want := map[string]string{FetchAgentPath: "0755"}
	if v.AgentCA != "" {
		want[AgentCAPath] = "0644"
	}
	for _, f := range files {
		m, _ := f.(map[string]any)
		if p, _ := m["path"].(string); want[p] != "" {
			if m["permissions"] != want[p] {
				t.Errorf("%s is written with permissions %v, want %s", p, m["permissions"], want[p])
			}
			delete(want, p)
		}
	}
	for p := range want {
		t.Errorf("write_files lacks %s", p)
	}
}

// TestMergeMatchesCloudInit checks the merge against cloud-init's own: a
// user #cloud-config merged by Render must mean, to cloud-init, exactly what
// the user's document followed by the operator's part (with MergeType) means
// when cloud-init merges them itself. The user documents are the merge
// golden and random ones full of YAML 1.1 traps (on, 0600, 1:20, dates), so
// that re-serialising the user's YAML is checked not to change its meaning.
func TestMergeMatchesCloudInit(t *testing.T) {
	_, python := cloudInit(t)
	docs := []string{mergeUserData}
	rnd := newRand(t, 7)
	for range 150 {
		docs = append(docs, randomUserCloudConfig(rnd))
	}
	v := baseVars()
	tmp := t.TempDir()
	var reqs []viewRequest
	rendered := 0
	for i, doc := range docs {
		body, err := execute(FieldUserData, doc, v)
		if err != nil {
			t.Fatalf("doc %d: %v\n%s", i, err, doc)
		}
		op1, err := operatorCloudConfig(&v)
		if err != nil {
			t.Fatal(err)
		}
		merged, err := buildUserData(body, op1)
		if err != nil {
			t.Fatalf("doc %d: merge: %v\n%s", i, err, body)
		}
		op2, _ := operatorCloudConfig(&v)
		mime, err := multipartUserData(mimePart{ctype: "text/cloud-config", filename: "user.cfg", body: body}, op2)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []struct {
			suffix string
			data   []byte
		}{{"merged", merged}, {"mime", mime}} {
			p := filepath.Join(tmp, f.suffix+"-"+itoa(i))
			if err := os.WriteFile(p, f.data, 0o600); err != nil {
				t.Fatal(err)
			}
			reqs = append(reqs, viewRequest{ID: f.suffix + "-" + itoa(i), UserData: p, MergedOut: p + ".cfg", Typed: true})
		}
		rendered++
	}
	res := runView(t, python, reqs)
	for i := range rendered {
		a, b := res["merged-"+itoa(i)].Config, res["mime-"+itoa(i)].Config
		if a == nil || b == nil {
			t.Fatalf("doc %d: missing result", i)
		}
		if !reflect.DeepEqual(a, b) {
			ja, _ := json.MarshalIndent(a, "", " ")
			jb, _ := json.MarshalIndent(b, "", " ")
			t.Errorf("doc %d: cloud-init reads HyperFleet's merge differently from its own merge of the parts\nuser document:\n%s\n--- HyperFleet's merge:\n%s\n--- cloud-init's merge:\n%s", i, docs[i], ja, jb)
		}
	}
}
