package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestReadGuestTimings(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("TestB.json", `{"test":"TestB","queuedAt":"2026-11-22T17:38:21Z","vms":[{"name":"b-1","vmid":1001,"at":{"created":1,"booted":2,"cloud-init done":140,"runner online":156,"job started":156.5,"job completed":161.5,"powered off":161.75,"destroyed":162.25}}]}`)
	write("TestA.json", `{"test":"TestA","queuedAt":"2026-11-22T17:30:00Z","vms":[{"name":"a-1","vmid":1000,"at":{"created":1,"booted":2}}]}`)
	// Powered off in a sample 0.6 s before the job's recorded end (two
	// clocks): accepted, the step shown as no time.
	write("TestC.json", `{"test":"TestC","queuedAt":"2026-11-22T17:40:00Z","vms":[{"name":"c-1","vmid":1002,"at":{"job completed":100.6,"powered off":100,"destroyed":101}}]}`)
	// A standby VM: built and suspended before the queueing (negative
	// times), resumed for its job.
	write("TestS.json", `{"test":"TestS","queuedAt":"2026-11-22T17:50:00Z","vms":[{"name":"s-1","vmid":1003,"at":{"created":-60,"booted":-59.5,"cloud-init done":-40,"suspended":-30,"resume asked":2,"resumed":5,"credential placed":6.5,"runner online":12,"job started":12.5,"job completed":17.5,"powered off":18,"destroyed":18.5}}]}`)
	write("notes.txt", "not a timings file")

	runs, err := ReadGuestTimings(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 4 || runs[0].Test != "TestA" || runs[1].Test != "TestB" || runs[2].Test != "TestC" || runs[3].Test != "TestS" {
		t.Fatalf("runs = %+v, want TestA, TestB, TestC, TestS", runs)
	}

	var b strings.Builder
	writeGuestSection(&b, runs, []ColdStart{{Clone: time.Second, Boot: 20 * time.Second, Registration: 1500 * time.Millisecond}})
	got := b.String()
	for _, want := range []string{
		"| simulated (this run) | first cold start | 1.00 s | 20.00 s | 1.50 s | - |",
		// b-1: clone+start 1 s, boot+cloud-init 138 s, registration 16 s,
		// assigned 0.5 s, job 5 s, power-off 0.25 s, destroyed 0.5 s,
		// queued -> destroyed 162.25 s, queued -> runner online 156 s; a
		// cold VM has no standby split.
		"| b-1 (1001) | 1.00 s | 138.00 s | 16.00 s | 0.50 s | 5.00 s | 0.25 s | 0.50 s | 162.25 s | 156.00 s | - |",
		// a-1 never got further than booted.
		"| a-1 (1000) | 1.00 s | - | - | - | - | - | - | - | - | - |",
		"| c-1 (1002) | - | - | - | - | - | 0.00 s | 1.00 s | 101.00 s | - | - |",
		// s-1: its registration from its resume (7 s); queued -> online
		// 12 s of which the resume asked 2 s in: 3 + 1.5 + 5.5 = 10 s.
		"| s-1 (1003, *standby*) | 0.50 s | 19.50 s | 7.00 s | 0.50 s | 5.00 s | 0.50 s | 0.50 s | 18.50 s | 12.00 s | 3.00 s + 1.50 s + 5.50 s = 10.00 s (1.20) |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("section lacks %q:\n%s", want, got)
		}
	}
}

func TestReadGuestTimingsRefusesBadFiles(t *testing.T) {
	for name, body := range map[string]string{
		"not json":  `{`,
		"no test":   `{"queuedAt":"2026-11-22T17:30:00Z"}`,
		"no queued": `{"test":"TestA"}`,
		"backwards": `{"test":"TestA","queuedAt":"2026-11-22T17:30:00Z","vms":[{"name":"a","at":{"booted":5,"cloud-init done":3.5}}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "x.json"), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := ReadGuestTimings(dir); err == nil || !strings.Contains(err.Error(), "x.json") {
				t.Fatalf("ReadGuestTimings = %v, want an error naming x.json", err)
			}
		})
	}
	if runs, err := ReadGuestTimings(filepath.Join(t.TempDir(), "absent")); err != nil || runs != nil {
		t.Fatalf("absent directory: %v, %v; want none and no error", runs, err)
	}
	var b strings.Builder
	writeGuestSection(&b, nil, nil)
	if !strings.Contains(b.String(), "No real-guest timings") {
		t.Errorf("empty section = %q", b.String())
	}
}
