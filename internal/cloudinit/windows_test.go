package cloudinit

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/mail"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	yaml "go.yaml.in/yaml/v3"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testdeps"
)

// cloudbaseInitCloudConfig are the top-level keys cloudbase-init's
// cloud-config plugin acts on: cloudbase/cloudbase-init's
// cloudbaseinit/plugins/common/userdataplugins/cloudconfigplugins/factory.py
// (PLUGINS). Any other key is logged as "not supported" and ignored.
var cloudbaseInitCloudConfig = []string{"write_files", "set_timezone", "timezone", "set_hostname", "hostname", "ntp", "groups", "users", "runcmd"}

// cloudbaseInitWriteFiles are the keys of a write_files item its
// WriteFilesPlugin reads (cloudconfigplugins/write_files.py upstream), and
// the encodings it decodes (_decode_steps; others are written as text).
var (
	cloudbaseInitWriteFiles    = []string{"path", "content", "owner", "permissions", "encoding", "append"}
	cloudbaseInitFileEncodings = []string{"", "b64", "base64", "gz", "gzip", "gz+base64", "gzip+base64", "gz+b64", "gzip+b64"}
)

// cloudbaseInitPartTypes are the content types of the default
// user_data_plugins (cloudbaseinit/conf/default.py upstream): a part of
// another type is skipped with "Userdata plugin not found".
var cloudbaseInitPartTypes = []string{"text/part-handler", "text/cloud-config", "text/cloud-boothook", "text/x-shellscript", "multipart/mixed", "text/x-cfninitdata"}

// ps1Header is what makes cloudbase-init run a script with the 64-bit
// PowerShell (userdatautils.py upstream: ^#(ps1|ps1_sysnative)\s).
var ps1Header = regexp.MustCompile(`^#(ps1|ps1_sysnative)\s`)

// TestWindowsUserDataIsCloudbaseInitFormat: a Windows VM's user data is
// what cloudbase-init processes, checked against the rules of its source
// (the tables above): multipart as its UserDataPlugin detects it, parts of
// types it has plugins for, a cloud-config of keys and write_files items it
// acts on, a PowerShell part it runs (its .ps1 file name and header), and
// an agent config the agent accepts at the Windows paths. No Windows guest
// runs it here (docs/windows.md).
func TestWindowsUserDataIsCloudbaseInitFormat(t *testing.T) {
	for _, tc := range goldenCases() {
		if tc.in.Vars.GuestOS != GuestWindows {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			ud, err := os.ReadFile(filepath.Join("testdata", tc.name, "user-data"))
			if err != nil {
				t.Fatal(err)
			}
			// UserDataPlugin._process_user_data: multipart exactly when the
			// text before the first "\n\n" contains this (case-sensitive).
			if head, _, _ := strings.Cut(string(ud), "\n\n"); !strings.Contains(head, "Content-Type: multipart") {
				t.Fatalf("cloudbase-init would not see multipart user data; first header block %q", head)
			}
			msg, err := mail.ReadMessage(bytes.NewReader(ud))
			if err != nil {
				t.Fatal(err)
			}
			mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
			if err != nil || mt != "multipart/mixed" {
				t.Fatalf("top-level Content-Type %q (%v)", msg.Header.Get("Content-Type"), err)
			}
			mr := multipart.NewReader(msg.Body, params["boundary"])
			var types []string
			var agentJSON []byte
			for {
				p, err := mr.NextPart()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				body, err := io.ReadAll(p)
				if err != nil {
					t.Fatal(err)
				}
				ct, _, _ := mime.ParseMediaType(p.Header.Get("Content-Type"))
				types = append(types, ct)
				if !slices.Contains(cloudbaseInitPartTypes, ct) {
					t.Errorf("part %q has type %s, which no cloudbase-init plugin takes", p.FileName(), ct)
				}
				switch ct {
				case "text/cloud-config":
					agentJSON = checkCloudbaseCloudConfig(t, body)
				case "text/x-shellscript":
					// ShellScriptPlugin writes the part to its file name and
					// runs it by the extension (fileexecutils.exec_file).
					if !strings.HasSuffix(strings.ToLower(p.FileName()), ".ps1") {
						t.Errorf("script part named %q: cloudbase-init runs it by its extension, want .ps1", p.FileName())
					}
					if !ps1Header.Match(body) {
						t.Errorf("script part does not start with #ps1_sysnative: %q", firstLine(body))
					}
					checkPowerShellShape(t, string(body))
				}
			}
			if want := []string{"text/cloud-config", "text/x-shellscript"}; !slices.Equal(types, want) {
				t.Errorf("parts %v, want %v (the config is written before the script installs the service)", types, want)
			}
			cfg, err := agentconfig.Parse(agentJSON)
			if err != nil {
				t.Fatalf("the agent config cloudbase-init writes: %v", err)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatalf("the agent config cloudbase-init writes is invalid: %v", err)
			}
			sw := cfg.Runner.Software
			if cfg.SecretsFile != agentconfig.WindowsSecretsFile || sw.InstallPath != `C:\opt\actions-runner` ||
				sw.WorkDir != `C:\var\lib\hyperfleet\work` || sw.ConfigScript != "config.cmd" || sw.RunScript != "run.cmd" || sw.OS != "win" {
				t.Errorf("agent config: secretsFile %q, software %+v", cfg.SecretsFile, sw)
			}
			if cfg.JITConfig != "" || cfg.RegistrationToken != "" {
				t.Error("a runner credential is in the user data")
			}
			// meta-data: the NoCloud service reads instance-id and
			// local-hostname (nocloudservice.py upstream).
			md, err := os.ReadFile(filepath.Join("testdata", tc.name, "meta-data"))
			if err != nil {
				t.Fatal(err)
			}
			var meta map[string]any
			if err := yaml.Unmarshal(md, &meta); err != nil || meta["instance-id"] != tc.in.Vars.InstanceID || meta["local-hostname"] != tc.in.Vars.Hostname {
				t.Errorf("meta-data %v (%v)", meta, err)
			}
			// network-config: version 2 with ethernets matched by MAC,
			// which its NoCloudNetworkConfigV2Parser reads.
			nc, err := os.ReadFile(filepath.Join("testdata", tc.name, "network-config"))
			if err != nil {
				t.Fatal(err)
			}
			var net struct {
				Version   int                       `yaml:"version"`
				Ethernets map[string]map[string]any `yaml:"ethernets"`
			}
			if err := yaml.Unmarshal(nc, &net); err != nil || net.Version != 2 || len(net.Ethernets) != 1 {
				t.Errorf("network-config %+v (%v)", net, err)
			}
		})
	}
}

// checkCloudbaseCloudConfig checks a cloud-config part against
// cloudbase-init's plugins and returns the agent config it writes.
func checkCloudbaseCloudConfig(t *testing.T, body []byte) []byte {
	t.Helper()
	if !bytes.HasPrefix(body, []byte("#cloud-config\n")) {
		t.Errorf("cloud-config part does not start with #cloud-config")
	}
	var doc map[string]any
	if err := yaml.Unmarshal(body, &doc); err != nil {
		t.Fatalf("cloud-config part: %v", err)
	}
	var agentJSON []byte
	for k, v := range doc {
		if !slices.Contains(cloudbaseInitCloudConfig, k) {
			t.Errorf("cloud-config key %q: cloudbase-init has no plugin for it", k)
		}
		if k == "set_hostname" || k == "hostname" {
			t.Errorf("cloud-config key %q: cloudbase-init reboots for it in the middle of the user data; the name comes from meta-data", k)
		}
		if k != "write_files" {
			continue
		}
		items, _ := v.([]any)
		for _, it := range items {
			item, _ := it.(map[string]any)
			for ik := range item {
				if !slices.Contains(cloudbaseInitWriteFiles, ik) {
					t.Errorf("write_files key %q: cloudbase-init ignores it", ik)
				}
			}
			enc, _ := item["encoding"].(string)
			if !slices.Contains(cloudbaseInitFileEncodings, enc) {
				t.Errorf("write_files encoding %q: cloudbase-init would write the text undecoded", enc)
			}
			path, _ := item["path"].(string)
			if !agentconfig.IsWindowsAbs(path) {
				t.Errorf("write_files path %q is not an absolute Windows path", path)
			}
			content, _ := item["content"].(string)
			if path == agentconfig.WindowsPath {
				raw, err := base64.StdEncoding.DecodeString(content)
				if err != nil {
					t.Fatalf("agent config content: %v", err)
				}
				agentJSON = raw
			}
		}
	}
	if agentJSON == nil {
		t.Fatalf("no write_files item writes %s", agentconfig.WindowsPath)
	}
	return agentJSON
}

// checkPowerShellShape checks what a grammar does not
// (TestWindowsPowerShellParses parses the script): every native command's
// exit code checked, cmdlet errors stopping the script; and, cheaply here,
// balanced braces, brackets, parentheses and quotes outside comments.
func checkPowerShellShape(t *testing.T, script string) {
	t.Helper()
	var stack []rune
	pairs := map[rune]rune{')': '(', '}': '{', ']': '['}
	for n, line := range strings.Split(script, "\n") {
		inSingle, inDouble := false, false
	chars:
		for _, r := range line {
			switch {
			case inSingle:
				inSingle = r != '\''
			case inDouble:
				inDouble = r != '"'
			case r == '#':
				break chars // a comment to the end of the line
			case r == '\'':
				inSingle = true
			case r == '"':
				inDouble = true
			case r == '(' || r == '{' || r == '[':
				stack = append(stack, r)
			case r == ')' || r == '}' || r == ']':
				if len(stack) == 0 || stack[len(stack)-1] != pairs[r] {
					t.Fatalf("line %d: unbalanced %q: %s", n+1, r, line)
				}
				stack = stack[:len(stack)-1]
			}
		}
		if inSingle || inDouble {
			t.Fatalf("line %d: unterminated string: %s", n+1, line)
		}
	}
	if len(stack) > 0 {
		t.Fatalf("unclosed %q", string(stack))
	}
	for _, native := range []string{"icacls.exe", "$agent service install"} {
		i := strings.Index(script, native)
		if i < 0 {
			t.Fatalf("the script does not run %s", native)
		}
		if !strings.Contains(script[i:], "$LASTEXITCODE -ne 0") {
			t.Errorf("%s's exit code is not checked", native)
		}
	}
	if !strings.Contains(script, "$ErrorActionPreference = 'Stop'") {
		t.Error("cmdlet errors do not stop the script")
	}
}

func firstLine(b []byte) string {
	l, _, _ := bytes.Cut(b, []byte("\n"))
	return string(l)
}

// TestWindowsPowerShellParses: the PowerShell part of every Windows golden
// parses without a syntax error under tree-sitter's PowerShell grammar
// (hack/powershell-parse/parse.mjs; Debian has no PowerShell to ask), and
// the same script with a brace removed does not: the check can fail.
func TestWindowsPowerShellParses(t *testing.T) {
	modules := testdeps.PowerShellGrammarDir(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node runs the PowerShell parser: %v (run `make test-deps`)", err)
	}
	parse := func(script []byte) (errs []string, statements int) {
		t.Helper()
		f := filepath.Join(t.TempDir(), "script.ps1")
		if err := os.WriteFile(f, script, 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// --liftoff-only: V8's optimizing wasm compiler spends some 15 s
		// of CPU on the grammar, the baseline one a tenth of a second.
		out, err := exec.CommandContext(ctx, node, "--liftoff-only", filepath.Join("..", "..", "hack", "powershell-parse", "parse.mjs"), modules, f).Output()
		if err != nil {
			t.Fatalf("parse.mjs: %v", err)
		}
		var res struct {
			Errors     []string `json:"errors"`
			Statements int      `json:"statements"`
		}
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("parse.mjs printed %q: %v", out, err)
		}
		return res.Errors, res.Statements
	}
	n := 0
	for _, tc := range goldenCases() {
		if tc.in.Vars.GuestOS != GuestWindows {
			continue
		}
		n++
		ud, err := os.ReadFile(filepath.Join("testdata", tc.name, "user-data"))
		if err != nil {
			t.Fatal(err)
		}
		script := partOfType(t, ud, "text/x-shellscript")
		if errs, statements := parse(script); len(errs) > 0 || statements < 4 {
			t.Errorf("%s: the PowerShell part does not parse (%d statements): %v", tc.name, statements, errs)
		}
		i := bytes.LastIndexByte(script, '}')
		broken := append(append([]byte{}, script[:i]...), script[i+1:]...)
		if errs, _ := parse(broken); len(errs) == 0 {
			t.Errorf("%s: the script without its last '}' parses: the parser checks nothing", tc.name)
		}
	}
	if n == 0 {
		t.Fatal("no Windows golden")
	}
}

// partOfType is the body of the first part of a MIME multipart user data
// with the given content type.
func partOfType(t *testing.T, ud []byte, contentType string) []byte {
	t.Helper()
	msg, err := mail.ReadMessage(bytes.NewReader(ud))
	if err != nil {
		t.Fatal(err)
	}
	_, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil {
		t.Fatal(err)
	}
	mr := multipart.NewReader(msg.Body, params["boundary"])
	for {
		p, err := mr.NextPart()
		if err != nil {
			t.Fatalf("no %s part: %v", contentType, err)
		}
		if ct, _, _ := mime.ParseMediaType(p.Header.Get("Content-Type")); ct == contentType {
			body, err := io.ReadAll(p)
			if err != nil {
				t.Fatal(err)
			}
			return body
		}
	}
}
