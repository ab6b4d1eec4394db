//go:build flood

// Package flood attacks the built manager process's two internet-facing
// servers, the agent server (agent downloads, power-off notices, the
// credential broker) and the GitHub webhook receiver, as a hostile CI job
// in a VM (or anyone who reaches the webhook port) would, and checks that
// the process stays inside its memory and that legitimate traffic still
// gets through (docs/security.md, "The agent server's bounds").
//
// The manager runs as its own process (test/managerproc), built from
// cmd/hyperfleet, against the local world of internal/testworld/devenv: the real
// kube-apiserver, the Proxmox VE and GitHub simulators, and guests that
// download the real agent from the manager's agent server, run a job and
// send their power-off notice. Attackers connect from other loopback
// addresses (127.0.0.2 for the agent server, with 127.0.0.4 for the second
// of two hostile jobs holding its cap, 127.0.0.3 for the receiver,
// 127.0.1.1-40 for the global cap) than the world's legitimate traffic
// (127.0.0.1). `make test-flood` runs it (about 3 minutes).
//
// HF_FLOOD_MANAGER, when set, is another manager binary to attack in the
// same way (an older build, for the comparison in docs/security.md): the
// figures are logged and nothing is asserted. HF_FLOOD_ONLY, when set,
// runs only the variants whose "<server>: <attack>" contains it (such as
// "webhook"), so that a build that keeps what one attack made it grow can
// be measured one attack at a time.
package flood

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agent"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/agentserver"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/test/managerproc"
)

const (
	// attackConns is each variant's number of connections.
	attackConns = 4000
	// http2Conns is the HTTP/2 variant's: each opens streamsPerConn
	// streams (16,000 requests in all).
	http2Conns = 64
	// maxGrowth bounds the manager's RSS growth over its rest level
	// under any variant: a quarter of the Deployment's 256 MiB limit.
	maxGrowth = 64 << 20
	// jobDeadline bounds one job's run during a flood.
	jobDeadline = 2 * time.Minute
	// downloadTimeout is the manager's --agent-server-download-timeout
	// here: short, so that the slow downloads are seen cut while the
	// variant runs (a legitimate download takes well under a second).
	downloadTimeout = 20 * time.Second
)

// attacker addresses (Linux routes all of 127/8 to lo).
var (
	agentAttacker   = []string{"127.0.0.2"}
	webhookAttacker = []string{"127.0.0.3"}
	// capAttackers are two hostile jobs' VMs, as many as used to hold
	// the agent server's whole cap.
	capAttackers = []string{"127.0.0.2", "127.0.0.4"}
)

// spread are 40 attacker addresses, each under the per-address cap, 4,000
// connections together far over the global one.
func spread() []string {
	out := make([]string, 40)
	for i := range out {
		out[i] = fmt.Sprintf("127.0.1.%d", i+1)
	}
	return out
}

// result is one variant's figures.
type result struct {
	server, variant           string
	baseRSS, peakRSS, hwm     int64
	established, refused, cut int64
	refusedByCap              map[string]float64
	socketMemPeak             int64
	legit                     string
}

func TestFlood(t *testing.T) {
	compare := os.Getenv("HF_FLOOD_MANAGER")
	raiseFileLimit(t)
	dir := t.TempDir()
	agentBin := managerproc.GoBuild(t, dir, "./cmd/hyperfleet-agent")
	managerBin := compare
	if managerBin == "" {
		managerBin = managerproc.GoBuild(t, dir, "./cmd/hyperfleet")
	}
	ctx := context.Background()
	w, err := devenv.Start(ctx, devenv.Options{
		Dir: filepath.Join(dir, "world"), AgentBinary: agentBin, ExternalOperator: true, AgentFromOperator: true, MaxReplicas: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	var args []string
	if compare == "" {
		args = []string{"--agent-server-download-timeout=" + downloadTimeout.String()}
	}
	op := managerproc.Start(t, w, managerproc.Options{Binary: managerBin, AgentBinary: agentBin, CAFile: w.OperatorInputs().GitHubCAFile, Args: args})
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(op.LogFile); err == nil {
				t.Logf("manager log (last 8 KiB):\n%s", managerproc.Tail(b, 8<<10))
			}
		}
	})
	if err := w.ConnectOperator(ctx, op.WebhookURL); err != nil {
		t.Fatal(err)
	}
	check := func(err error) {
		t.Helper()
		if err == nil {
			return
		}
		if compare != "" {
			t.Logf("(comparison run, not asserted) %v", err)
			return
		}
		t.Error(err)
	}
	// A job at rest first: the manager's steady state, not its start, is
	// the level growth is measured from.
	// The install's ownership key, which the manager created: a genuine
	// power-off token is the claim's HMAC under it.
	signer, err := manager.LoadOrCreateSigner(ctx, w.API.Client, manager.SignerOptions{Namespace: w.OperatorInputs().Namespace, Name: "hyperfleet-ownership"})
	if err != nil {
		t.Fatal(err)
	}
	check(runJob(t, w, op, signer))
	base := op.Usage(t).RSS
	t.Logf("manager at rest after one job: RSS %d MiB", base>>20)

	noticeH2 := http2Attack("/hints/v1/power-off", map[string]string{"authorization": "Bearer " + strings.Repeat("0f", 32), "content-type": "application/json"})
	webhookH2 := http2Attack("/webhooks/github", map[string]string{"content-type": "application/json", "x-github-event": "workflow_job",
		"x-github-delivery": "00000000-0000-0000-0000-000000000000", "x-hub-signature-256": "sha256=" + strings.Repeat("0", 64)})
	variants := []struct {
		server, addr string
		name         string
		floods       func() []*flood
		// legit is the legitimate traffic during the flood.
		legit func() error
		// after, when set, checks what the server did to the attack,
		// after legit.
		after func([]*flood) error
		// globalCap: the variant holds the global cap, so new general
		// connections are refused while it lasts (legit uses the
		// reserve), and the server must serve again once it ends.
		globalCap bool
	}{
		{"agent", op.AgentServerAddr, "stalled power-off notices, 4,000 connections", func() []*flood {
			return []*flood{startFlood(op.AgentServerAddr, agentAttacker, attackConns, noticeAttack)}
		}, func() error { return runJob(t, w, op, signer) }, nil, false},
		{"agent", op.AgentServerAddr, "HTTP/2, 64 connections x 250 streams", func() []*flood {
			return []*flood{
				startFlood(op.AgentServerAddr, agentAttacker, http2Conns/2, withALPN(noticeH2, "h2", "http/1.1")),
				startFlood(op.AgentServerAddr, agentAttacker, http2Conns/2, withALPN(noticeH2, "http/1.1")),
			}
		}, func() error { return runJob(t, w, op, signer) }, nil, false},
		{"agent", op.AgentServerAddr, "zero-window downloads, 4,000 connections", func() []*flood {
			return []*flood{startFlood(op.AgentServerAddr, agentAttacker, attackConns, downloadAttack)}
		}, func() error { return runJob(t, w, op, signer) }, nil, false},
		{"agent", op.AgentServerAddr, "slow downloads (256 KiB every 20 s), 4,000 connections", func() []*flood {
			return []*flood{startFlood(op.AgentServerAddr, agentAttacker, attackConns, slowDownloadAttack)}
		}, func() error { return runJob(t, w, op, signer) }, downloadsCut, false},
		{"agent", op.AgentServerAddr, "two hostile jobs holding what they can (zero-window downloads, endless request heads), 4,000 connections from 127.0.0.2 and 127.0.0.4", func() []*flood {
			return []*flood{startFlood(op.AgentServerAddr, capAttackers, attackConns, capAttack)}
		}, func() error { return runJob(t, w, op, signer) }, nil, false},
		{"webhook", op.WebhookAddr, "stalled unsigned deliveries, 4,000 connections", func() []*flood {
			return []*flood{startFlood(op.WebhookAddr, webhookAttacker, attackConns, webhookAttack)}
		}, func() error { return runJob(t, w, op, signer) }, nil, false},
		{"webhook", op.WebhookAddr, "HTTP/2, 64 connections x 250 streams", func() []*flood {
			return []*flood{
				startFlood(op.WebhookAddr, webhookAttacker, http2Conns/2, withALPN(webhookH2, "h2", "http/1.1")),
				startFlood(op.WebhookAddr, webhookAttacker, http2Conns/2, withALPN(webhookH2, "http/1.1")),
			}
		}, func() error { return runJob(t, w, op, signer) }, nil, false},
		{"agent", op.AgentServerAddr, "zero-window downloads, 4,000 connections from 40 addresses (global cap)", func() []*flood {
			return []*flood{startFlood(op.AgentServerAddr, spread(), attackConns, downloadAttack)}
		}, func() error { return reservedNotice(op, signer) }, nil, true},
	}
	var results []result
	for _, v := range variants {
		if only := os.Getenv("HF_FLOOD_ONLY"); only != "" && !strings.Contains(v.server+": "+v.name, only) {
			continue
		}
		refusedBefore, _ := op.Counters("hyperfleet_https_connections_refused_total", serverReason(v.server))
		peak := watchRSS(op)
		floods := v.floods()
		for _, f := range floods {
			f.firstRound.Wait()
		}
		legitErr := v.legit()
		legit := "a job ran to the end (its webhooks 202, the agent downloaded, a genuine power-off notice 202, the VM destroyed)"
		if v.globalCap {
			legit = "a genuine power-off notice 202 over the reserve during the flood; served again after it"
		}
		if v.after != nil {
			legitErr = errors.Join(legitErr, v.after(floods))
		}
		r := result{server: v.server, variant: v.name, baseRSS: base, legit: legit}
		for _, f := range floods {
			r.established += f.established.Load()
			r.refused += f.refused.Load()
			r.cut += f.cut.Load()
		}
		refusedAfter, _ := op.Counters("hyperfleet_https_connections_refused_total", serverReason(v.server))
		r.refusedByCap = map[string]float64{}
		for k, n := range refusedAfter {
			if d := n - refusedBefore[k]; d > 0 {
				r.refusedByCap[k] = d
			}
		}
		r.peakRSS, r.socketMemPeak = peak()
		r.hwm = op.Usage(t).HWM
		for _, f := range floods {
			f.stop()
		}
		if v.globalCap {
			legitErr = errors.Join(legitErr, servesAgain(op))
			if r.refusedByCap["max_conns"]+r.refusedByCap["reserved_per_address"] == 0 {
				legitErr = errors.Join(legitErr, fmt.Errorf("no connection was refused by the global cap: %v", r.refusedByCap))
			}
		}
		if legitErr != nil {
			r.legit = "failed: " + legitErr.Error()
		}
		t.Logf("%s server, %s: RSS %d MiB at rest, peak %d MiB (VmHWM %d MiB); attacker connections %d established, %d refused, %d cut while held; refused by cap %v; kernel TCP memory peak %d MiB; legitimate traffic: %s",
			r.server, r.variant, r.baseRSS>>20, r.peakRSS>>20, r.hwm>>20, r.established, r.refused, r.cut, r.refusedByCap, r.socketMemPeak>>20, r.legit)
		check(legitErr)
		if grew := r.peakRSS - base; grew > maxGrowth {
			check(fmt.Errorf("%s server, %s: RSS grew by %d MiB (%d to %d MiB), more than %d MiB", v.server, v.name, grew>>20, base>>20, r.peakRSS>>20, maxGrowth>>20))
		}
		results = append(results, r)
	}
	t.Log("figures for docs/security.md:\n" + table(results))
}

func serverReason(server string) func(map[string]string) string {
	return func(l map[string]string) string {
		if l["server"] != server {
			return "other server"
		}
		return l["reason"]
	}
}

// runJob queues one job and waits until it ran to the end on a fresh VM:
// every webhook GitHub delivered about it was accepted (202), the VM
// downloaded the agent from the agent server and ran the job, and the VM
// and its claim are gone. While the claim's VM runs, a genuine power-off
// notice for it (the claim's own token, from 127.0.0.1, as its agent
// sends it) must be accepted (202). The VM's agent sends one too, right
// before it powers off, but the job's completion may end the claim and
// stop the VM first: that race is the product's, not the flood's.
func runJob(t *testing.T, w *devenv.World, op *managerproc.Process, signer *ownership.Signer) error {
	t.Helper()
	ids, err := w.EnqueueJobs(1, 3*time.Second)
	if err != nil {
		return err
	}
	id := ids[0]
	noticed := -1 // the genuine notice's answer, once sent
	var noticeErr error
	deadline := time.Now().Add(jobDeadline)
	for {
		j, _ := w.GitHub.Job(id)
		cs := claims(t, w)
		if noticed < 0 {
			for _, c := range cs {
				if c.Status.VMRef != nil && c.Status.VMRef.VMID != 0 {
					noticed, noticeErr = genuineNotice(op, signer, c)
					break
				}
			}
		}
		if j.Status == "completed" && len(vms(w)) == 0 && len(cs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("job %d did not run to the end within %s: status %s, %d VMs, %d claims", id, jobDeadline, j.Status, len(vms(w)), len(cs))
		}
		time.Sleep(100 * time.Millisecond)
	}
	n := 0
	for _, d := range w.GitHub.Deliveries() {
		if d.JobID != id {
			continue
		}
		n++
		if d.StatusCode != http.StatusAccepted {
			return fmt.Errorf("job %d: the %s delivery got %d (%s), want 202", id, d.Action, d.StatusCode, d.Error)
		}
	}
	if n == 0 {
		return fmt.Errorf("job %d: no webhook delivered", id)
	}
	if noticeErr != nil {
		return fmt.Errorf("job %d: a genuine power-off notice for its claim: %w", id, noticeErr)
	}
	if noticed != http.StatusAccepted {
		return fmt.Errorf("job %d: a genuine power-off notice for its claim got %d, want 202", id, noticed)
	}
	return nil
}

// genuineNotice sends claim's power-off notice with its own token, as the
// agent does (agent.PostNotice), from 127.0.0.1, and returns the answer.
func genuineNotice(op *managerproc.Process, signer *ownership.Signer, c hfv1.MachineClaim) (int, error) {
	n := &agentconfig.PowerOffNotify{
		URL:   "https://" + op.AgentServerAddr + agentserver.PowerOffPath,
		Token: signer.PowerOffToken(c.Namespace, c.Name, string(c.UID)),
		Claim: agentconfig.ClaimRef{Namespace: c.Namespace, Name: c.Name, UID: string(c.UID)},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := &http.Client{Transport: insecureTransport()}
	return agent.PostNotice(ctx, hc, n, []byte(`{"runnerOnline":true}`))
}

func vms(w *devenv.World) []int {
	var out []int
	for _, vm := range w.Proxmox.VMs() {
		if !vm.Template {
			out = append(out, vm.VMID)
		}
	}
	return out
}

func claims(t *testing.T, w *devenv.World) []hfv1.MachineClaim {
	var list hfv1.MachineClaimList
	if err := w.API.Client.List(context.Background(), &list, client.InNamespace(devenv.Namespace)); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// downloadsCut waits (bounded) until the server cut slow downloads that
// kept reading: they are cut at --agent-server-download-timeout, where
// before they stayed in progress for hours.
func downloadsCut(floods []*flood) error {
	deadline := time.Now().Add(downloadTimeout + time.Minute)
	for time.Now().Before(deadline) {
		for _, f := range floods {
			if f.cut.Load() > 0 {
				return nil
			}
		}
		time.Sleep(time.Second)
	}
	return fmt.Errorf("no slow download was cut within %s of the flood's start, though --agent-server-download-timeout is %s", downloadTimeout+time.Minute, downloadTimeout)
}

// reservedNotice sends genuine power-off notices from 127.0.0.1, as an
// agent does (agent.PostNotice, with its token), while the global cap is
// held, until one is accepted (202) within 30 s: the reserve
// (--agent-server-reserved-conns) admits it when no general connection
// is left. The claim is one that does not exist: a notice is a hint, and
// an unknown claim's is accepted all the same.
func reservedNotice(op *managerproc.Process, signer *ownership.Signer) error {
	c := hfv1.MachineClaim{}
	c.Namespace, c.Name, c.UID = devenv.Namespace, "flood-legit", "00000000-0000-4000-8000-00000000f100"
	var last error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		code, err := genuineNotice(op, signer, c)
		if err == nil && code == http.StatusAccepted {
			return nil
		}
		last = err
		if err == nil {
			last = fmt.Errorf("answered %d", code)
		}
	}
	return fmt.Errorf("no genuine power-off notice was accepted within 30 s while the global cap was held (last: %w)", last)
}

// servesAgain waits (bounded) until a legitimate client at 127.0.0.1
// gets the agent's checksum from the agent server.
func servesAgain(op *managerproc.Process) error {
	c := &http.Client{Timeout: 5 * time.Second, Transport: insecureTransport()}
	var last error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		resp, err := c.Get("https://" + op.AgentServerAddr + "/agent/v1/hyperfleet-agent-linux-amd64.sha256")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s", resp.Status)
		}
		last = err
	}
	return fmt.Errorf("the agent server did not serve again within a minute after the flood: %w", last)
}

// watchRSS samples the manager's RSS, and the kernel's TCP memory, every
// 100 ms until the returned function is called; that returns the peaks.
func watchRSS(op *managerproc.Process) func() (rss, tcpMem int64) {
	var mu sync.Mutex
	var peak, mem int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if u, err := readRSS(op); err == nil {
				mu.Lock()
				peak = max(peak, u)
				mu.Unlock()
			}
			if m, err := tcpMemory(); err == nil {
				mu.Lock()
				mem = max(mem, m)
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() (int64, int64) {
		close(stop)
		<-done
		return peak, mem
	}
}

func readRSS(op *managerproc.Process) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", op.Cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		var kb int64
		if _, err := fmt.Sscanf(line, "VmRSS: %d kB", &kb); err == nil {
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS")
}

// tcpMemory is the kernel's memory for TCP buffers, machine-wide
// (/proc/net/sockstat "TCP: ... mem <pages>").
func tcpMemory() (int64, error) {
	b, err := os.ReadFile("/proc/net/sockstat")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "TCP:" {
			continue
		}
		for i := 1; i+1 < len(f); i++ {
			if f[i] == "mem" {
				var pages int64
				if _, err := fmt.Sscan(f[i+1], &pages); err != nil {
					return 0, err
				}
				return pages * int64(os.Getpagesize()), nil
			}
		}
	}
	return 0, fmt.Errorf("no TCP mem in /proc/net/sockstat")
}

// raiseFileLimit lets this process hold every attacker connection: the
// soft limit up to the hard one (the manager, started after, inherits it).
func raiseFileLimit(t *testing.T) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		t.Fatal(err)
	}
	l.Cur = l.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		t.Fatal(err)
	}
	if need := uint64(attackConns + 2000); l.Cur < need {
		t.Fatalf("the open-file limit is %d; the flood needs %d: raise the hard limit (ulimit -Hn)", l.Cur, need)
	}
}

func table(rs []result) string {
	var b strings.Builder
	b.WriteString("| server | attack | RSS at rest | peak RSS | attacker connections established / refused / cut while held | refused by cap | kernel TCP memory peak | legitimate traffic |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s | %s | %d MiB | %d MiB | %d / %d / %d | %v | %d MiB | %s |\n", r.server, r.variant, r.baseRSS>>20, r.peakRSS>>20, r.established, r.refused, r.cut, r.refusedByCap, r.socketMemPeak>>20, r.legit)
	}
	return b.String()
}
