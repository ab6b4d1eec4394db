package main

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
)

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// liveTable prints the world's state: redrawn in place on a terminal,
// printed when it changes otherwise (logs, CI).
type liveTable struct {
	out  io.Writer
	tty  bool
	now  func() time.Time
	last string
}

func (t *liveTable) show(s devenv.Snapshot, minReplicas, maxReplicas int) {
	var b strings.Builder
	counts := map[string]int{}
	for _, j := range s.PlatformJobs {
		counts[j.Status]++
	}
	st := s.Pool.Status
	fmt.Fprintf(&b, "RunnerPool %s/%s: desired %d, ready %d, idle %d, busy %d, starting %d, terminating %d (min %d, max %d)\n",
		devenv.Namespace, devenv.PoolName, st.DesiredReplicas, st.ReadyReplicas, st.IdleReplicas, st.BusyReplicas, st.StartingReplicas, st.TerminatingReplicas, minReplicas, maxReplicas)
	fmt.Fprintf(&b, "Jobs: %d queued, %d in progress, %d completed; VMs: %d; runners on %s: %d\n\n",
		counts["queued"], counts["in_progress"], counts["completed"], len(s.VMs), cmp.Or(s.Platform, "GitHub"), len(s.PlatformRunners))

	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tSTATUS\tRUNNER")
	for _, j := range s.PlatformJobs {
		status := j.Status
		if j.Conclusion != "" {
			status += " (" + j.Conclusion + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", j.ID, status, orDash(j.RunnerName))
	}
	_ = tw.Flush()
	b.WriteString("\n")
	tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLAIM\tPHASE\tVM\tVM STATUS\tRUNNER (STATUS)")
	vms := map[int32]string{}
	for _, vm := range s.VMs {
		vms[int32(vm.VMID)] = vm.Status
	}
	runners := map[string]devenv.PlatformRunner{}
	for _, r := range s.PlatformRunners {
		runners[r.Name] = r
	}
	for _, c := range s.Claims {
		vmid, vmStatus := "-", "-"
		if ref := c.Status.VMRef; ref != nil {
			vmid, vmStatus = strconv.Itoa(int(ref.VMID)), orDash(vms[ref.VMID])
		}
		// Runner names are the claim's name plus a suffix; the claim's
		// status records the one it registered.
		runner := "-"
		if bs := c.Status.Bootstrap; bs != nil && bs.RunnerName != "" {
			runner = bs.RunnerName + " (not registered)"
			if r, ok := runners[bs.RunnerName]; ok {
				runner = bs.RunnerName + " (" + r.Status
				if r.Busy {
					runner += ", busy"
				}
				runner += ")"
			}
		}
		phase := string(c.Status.Phase)
		if !c.DeletionTimestamp.IsZero() && c.Status.Phase != hfv1.MachineClaimTerminating {
			phase += " (deleting)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.Name, orDash(phase), vmid, vmStatus, runner)
	}
	_ = tw.Flush()
	text := b.String()
	if text == t.last {
		return
	}
	t.last = text
	now := time.Now
	if t.now != nil {
		now = t.now
	}
	stamp := now().Format("15:04:05")
	if t.tty {
		// Home the cursor and clear the screen, then draw.
		fmt.Fprint(t.out, "\033[H\033[2J"+stamp+"  (Enter: one more job, a number: that many, q: quit)\n\n"+text)
		return
	}
	fmt.Fprint(t.out, "---- "+stamp+"\n"+text)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
