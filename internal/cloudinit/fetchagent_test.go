package cloudinit

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"

	"github.com/hyperfleet/hyperfleet/internal/agentserver"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
)

// renderedAgentFetch is what the operator's cloud-config carries for the
// agent download: the written files by path and the runcmd entries.
type renderedAgentFetch struct {
	files  map[string]string
	perms  map[string]string
	runcmd [][]string
}

func parseAgentFetch(t *testing.T, userData []byte) renderedAgentFetch {
	t.Helper()
	var doc struct {
		WriteFiles []struct {
			Path        string `yaml:"path"`
			Permissions string `yaml:"permissions"`
			Content     string `yaml:"content"`
		} `yaml:"write_files"`
		Runcmd [][]string `yaml:"runcmd"`
	}
	if err := yaml.Unmarshal(userData, &doc); err != nil {
		t.Fatalf("rendered user-data: %v\n%s", err, userData)
	}
	out := renderedAgentFetch{files: map[string]string{}, perms: map[string]string{}, runcmd: doc.Runcmd}
	for _, f := range doc.WriteFiles {
		out.files[f.Path] = f.Content
		out.perms[f.Path] = f.Permissions
	}
	return out
}

// agentWorld is an agent server on loopback TLS, trusted through a CA, with
// one binary, and the cloud-config HyperFleet renders to fetch it.
type agentWorld struct {
	binPath string
	binary  []byte
	fetch   renderedAgentFetch
	dir     string // the test's scratch directory
	script  string // fetch-agent.sh as rendered, written to dir
	caFile  string // the rendered CA, written to dir
}

func newAgentWorld(t *testing.T) *agentWorld {
	t.Helper()
	w := &agentWorld{dir: t.TempDir()}
	bins := t.TempDir()
	w.binPath = filepath.Join(bins, "hyperfleet-agent-linux-amd64")
	w.binary = bytes.Repeat([]byte("\x7fELF stand-in for the agent\n"), 5000)
	if err := os.WriteFile(w.binPath, w.binary, 0o755); err != nil {
		t.Fatal(err)
	}

	cert, caPEM, err := githubsim.SelfSignedCertificate("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(nil)
	srv, err := agentserver.New(agentserver.Options{Dir: bins, URL: "https://" + ts.Listener.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	ts.Config.Handler = srv.Handler()
	ts.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	ts.StartTLS()
	t.Cleanup(ts.Close)

	url, sha, ok := srv.Lookup("linux", "x64")
	if !ok {
		t.Fatal("the agent server has no linux/x64 binary")
	}
	v := baseVars()
	v.AgentDownloadURL, v.AgentSHA256, v.AgentCA = url, sha, string(caPEM)
	out, err := Render(Input{Vars: v})
	if err != nil {
		t.Fatal(err)
	}
	w.fetch = parseAgentFetch(t, out.UserData)

	w.script = filepath.Join(w.dir, "fetch-agent.sh")
	w.caFile = filepath.Join(w.dir, "agent-ca.pem")
	if err := os.WriteFile(w.script, []byte(w.fetch.files[FetchAgentPath]), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(w.caFile, []byte(w.fetch.files[AgentCAPath]), 0o644); err != nil {
		t.Fatal(err)
	}
	return w
}

// tamper changes the served binary in place, keeping its length: the
// server keeps serving the open file, so VMs get other bytes than the
// checksum the operator handed them.
func (w *agentWorld) tamper(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(w.binPath, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("\x7fELF tampered!!"), 0); err != nil {
		t.Fatal(err)
	}
}

// runFetchCommand runs the rendered runcmd entry that installs the agent,
// with the script, the destination and the CA moved into the test's
// directory and systemctl replaced by a stub that records its arguments.
func (w *agentWorld) runFetchCommand(t *testing.T, dest string) (stderr, systemctl string, err error) {
	t.Helper()
	entry := w.fetch.runcmd[0]
	if len(entry) < 3 || entry[0] != "sh" || entry[1] != "-c" || !strings.Contains(entry[2], FetchAgentPath) {
		t.Fatalf("the first runcmd entry does not run %s: %q", FetchAgentPath, entry)
	}
	args := slices.Clone(entry)
	args[2] = strings.ReplaceAll(args[2], FetchAgentPath, w.script)
	for i := 3; i < len(args); i++ {
		switch args[i] {
		case AgentBinary:
			args[i] = dest
		case AgentCAPath:
			args[i] = w.caFile
		}
	}
	stubs := t.TempDir()
	log := filepath.Join(stubs, "systemctl.log")
	stub := "#!/bin/sh\necho \"$@\" >> " + log + "\n"
	if err := os.WriteFile(filepath.Join(stubs, "systemctl"), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "PATH="+stubs+string(os.PathListSeparator)+os.Getenv("PATH"), "NO_PROXY=*", "no_proxy=*")
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	err = cmd.Run()
	calls, _ := os.ReadFile(log)
	return errOut.String(), string(calls), err
}

// runScript runs fetch-agent.sh itself with the given shell.
func (w *agentWorld) runScript(t *testing.T, shell, url, sha, dest string) (string, error) {
	t.Helper()
	cmd := exec.Command(shell, w.script, url, sha, dest, w.caFile)
	cmd.Env = append(os.Environ(), "NO_PROXY=*", "no_proxy=*")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func noTempFiles(t *testing.T, dir string) {
	t.Helper()
	left, _ := filepath.Glob(filepath.Join(dir, ".hyperfleet-agent.*"))
	if len(left) > 0 {
		t.Errorf("temporary downloads left behind: %v", left)
	}
}

// TestFetchAgentScript executes the rendered download against the agent
// server: the right bytes are installed executable, tampered bytes never.
func TestFetchAgentScript(t *testing.T) {
	for _, tool := range []string{"sh", "curl", "sha256sum", "mktemp"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed to run the rendered download script: %v", tool, err)
		}
	}
	w := newAgentWorld(t)
	r := w.fetch
	if got := r.runcmd; len(got) != 3 || !slices.Equal(got[1], []string{"systemctl", "daemon-reload"}) ||
		!slices.Equal(got[2], []string{"systemctl", "start", "--no-block", AgentUnitName}) {
		t.Fatalf("runcmd = %q, want the download, then daemon-reload, then the agent's start", got)
	}
	if r.perms[FetchAgentPath] != "0755" || r.perms[AgentCAPath] != "0644" {
		t.Errorf("permissions: script %s, CA %s", r.perms[FetchAgentPath], r.perms[AgentCAPath])
	}
	url, sha := r.runcmd[0][4], r.runcmd[0][5]

	t.Run("installs the verified binary", func(t *testing.T) {
		dest := filepath.Join(t.TempDir(), "usr", "local", "bin", "hyperfleet-agent")
		stderr, calls, err := w.runFetchCommand(t, dest)
		if err != nil {
			t.Fatalf("the download failed: %v\n%s", err, stderr)
		}
		got, err := os.ReadFile(dest)
		if err != nil || !bytes.Equal(got, w.binary) {
			t.Fatalf("%s holds %d bytes (err %v), want the served %d", dest, len(got), err, len(w.binary))
		}
		if st, _ := os.Stat(dest); st.Mode().Perm() != 0o755 {
			t.Errorf("installed with mode %v, want 0755", st.Mode().Perm())
		}
		if calls != "" {
			t.Errorf("systemctl was called after a good download: %q", calls)
		}
		noTempFiles(t, filepath.Dir(dest))
	})

	for _, shell := range []string{"sh", "dash", "bash"} {
		if _, err := exec.LookPath(shell); err != nil {
			continue
		}
		t.Run("bad arguments/"+shell, func(t *testing.T) {
			dest := filepath.Join(t.TempDir(), "hyperfleet-agent")
			for _, bad := range [][2]string{
				{strings.Replace(url, "https://", "http://", 1), sha},
				{url, strings.ToUpper(sha)},
				{url, sha[:63]},
			} {
				out, err := w.runScript(t, shell, bad[0], bad[1], dest)
				if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.ExitCode() != 2 {
					t.Errorf("%s with %q: %v (want exit status 2)\n%s", shell, bad, err, out)
				}
			}
			if _, err := os.Stat(dest); err == nil {
				t.Error("bad arguments installed something")
			}
		})
	}

	t.Run("unknown binary", func(t *testing.T) {
		dest := filepath.Join(t.TempDir(), "hyperfleet-agent")
		other := strings.Replace(url, "linux-amd64", "linux-arm64", 1)
		out, err := w.runScript(t, "sh", other, sha, dest)
		if err == nil || !strings.Contains(out, "downloading") || !strings.Contains(out, "404") {
			t.Errorf("a 404 download: %v\n%s", err, out)
		}
		if _, err := os.Stat(dest); err == nil {
			t.Error("a failed download installed something")
		}
		noTempFiles(t, filepath.Dir(dest))
	})

	// Last: tampering changes the served file for good.
	t.Run("tampered binary", func(t *testing.T) {
		w.tamper(t)
		// The script alone leaves an existing DEST as it was...
		dir := t.TempDir()
		dest := filepath.Join(dir, "hyperfleet-agent")
		if err := os.WriteFile(dest, []byte("the image's agent"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, shell := range []string{"sh", "bash"} {
			out, err := w.runScript(t, shell, url, sha, dest)
			if err == nil {
				t.Fatalf("%s: a tampered download was accepted:\n%s", shell, out)
			}
			for _, want := range []string{"checksum mismatch", "expected sha256 " + sha, "got "} {
				if !strings.Contains(out, want) {
					t.Errorf("%s: the message does not say %q:\n%s", shell, want, out)
				}
			}
			if got, _ := os.ReadFile(dest); string(got) != "the image's agent" {
				t.Errorf("%s: the script changed DEST after a failed download: %q", shell, got)
			}
			noTempFiles(t, dir)
		}

		// ...and the runcmd entry removes it and powers the VM off.
		stderr, calls, err := w.runFetchCommand(t, dest)
		if err == nil {
			t.Fatalf("the runcmd entry succeeded with a tampered binary:\n%s", stderr)
		}
		if _, err := os.Stat(dest); !os.IsNotExist(err) {
			t.Errorf("DEST is still there after a failed download: %v", err)
		}
		if strings.TrimSpace(calls) != "poweroff" {
			t.Errorf("systemctl calls = %q, want poweroff", calls)
		}
		if !strings.Contains(stderr, "checksum mismatch") || !strings.Contains(stderr, "powering the VM off") {
			t.Errorf("stderr does not explain the power-off:\n%s", stderr)
		}
		noTempFiles(t, dir)
	})
}

// TestFetchAgentOnlyWhenAsked: templates that keep the agent in the image
// get no download, and the download's paths are HyperFleet's.
func TestFetchAgentOnlyWhenAsked(t *testing.T) {
	out, err := Render(Input{Vars: baseVars()})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(out.UserData, []byte("fetch-agent")) || bytes.Contains(out.UserData, []byte(AgentCAPath)) {
		t.Errorf("the image's agent is downloaded anyway:\n%s", out.UserData)
	}

	// Without a CA the VM's system roots are used: no CA file, no --cacert.
	v := operatorAgentVars(baseVars())
	v.AgentCA = ""
	out, err = Render(Input{Vars: v})
	if err != nil {
		t.Fatal(err)
	}
	r := parseAgentFetch(t, out.UserData)
	if _, ok := r.files[AgentCAPath]; ok || slices.Contains(r.runcmd[0], AgentCAPath) {
		t.Errorf("a CA file without a CA: %q", r.runcmd[0])
	}

	// The operator's download may not be powered off when the VM is kept.
	v.PowerOffOnFinish = false
	out, err = Render(Input{Vars: v})
	if err != nil {
		t.Fatal(err)
	}
	if r := parseAgentFetch(t, out.UserData); strings.Contains(r.runcmd[0][2], "poweroff") {
		t.Errorf("powerOffOnFinish false, but a failed download powers off: %q", r.runcmd[0][2])
	}

	for _, path := range []string{FetchAgentPath, AgentCAPath} {
		_, err := Render(Input{Vars: baseVars(), UserData: "#cloud-config\nwrite_files:\n  - path: " + path + "\n    content: x\n"})
		if err == nil || !strings.Contains(err.Error(), "written by HyperFleet") {
			t.Errorf("a user's write_files of %s: %v", path, err)
		}
	}

	bad := map[string]func(*Vars){
		"http URL":        func(v *Vars) { v.AgentDownloadURL = "http://agents.example.com/a" },
		"URL with space":  func(v *Vars) { v.AgentDownloadURL = "https://agents.example.com/a b" },
		"short checksum":  func(v *Vars) { v.AgentSHA256 = "abc" },
		"checksum alone":  func(v *Vars) { v.AgentDownloadURL = "" },
		"CA not PEM":      func(v *Vars) { v.AgentCA = "not a certificate" },
		"upper-case hex":  func(v *Vars) { v.AgentSHA256 = strings.ToUpper(v.AgentSHA256) },
		"newline in URL":  func(v *Vars) { v.AgentDownloadURL += "\nrm -rf /" },
		"quote in URL ok": nil,
	}
	for name, mutate := range bad {
		v := operatorAgentVars(baseVars())
		if mutate == nil {
			// Quotes and shell syntax are harmless: the URL is an argument.
			v.AgentDownloadURL += "&x='$(reboot)'"
			if _, err := Render(Input{Vars: v}); err != nil {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		mutate(&v)
		if _, err := Render(Input{Vars: v}); err == nil || !strings.Contains(err.Error(), "vars: Agent") {
			t.Errorf("%s: Render accepted it (%v)", name, err)
		}
	}
}
