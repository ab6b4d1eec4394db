package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeAgent serves the guest agent's protocol on a unix socket, as QEMU's
// virtio-serial chardev passes it through: each connection first gets a
// stale answer left by an earlier client, then what the commands ask for.
// Silent agents read commands and never answer.
func fakeAgent(t *testing.T, silent bool) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "qga")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "qga.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveAgent(c, silent)
		}
	}()
	return sock
}

func serveAgent(c net.Conn, silent bool) {
	defer c.Close()
	_, _ = c.Write([]byte(`{"return": {"stale": true}}` + "\n"))
	r := bufio.NewReader(c)
	for {
		// Skip the client's 0xFF parser reset.
		if b, err := r.Peek(1); err == nil && b[0] == delimiter {
			_, _ = r.ReadByte()
		}
		var req struct {
			Execute   string          `json:"execute"`
			Arguments json.RawMessage `json:"arguments"`
		}
		if err := json.NewDecoder(r).Decode(&req); err != nil {
			return
		}
		if silent {
			continue
		}
		switch req.Execute {
		case "guest-sync-delimited":
			var a struct{ ID int64 }
			_ = json.Unmarshal(req.Arguments, &a)
			fmt.Fprintf(c, "\xff{\"return\": %d}\n", a.ID)
		case "guest-get-host-name":
			_, _ = c.Write([]byte(`{"return": {"host-name": "vm-1"}}` + "\n"))
		default:
			fmt.Fprintf(c, "{\"error\": {\"class\": \"CommandNotFound\", \"desc\": \"The command %s has not been found\"}}\n", req.Execute)
		}
		// The decoder above may have buffered nothing beyond one object:
		// clients send one command and wait.
		r = bufio.NewReader(c)
	}
}

func TestAgentCallSkipsStaleAnswers(t *testing.T) {
	sock := fakeAgent(t, false)
	var host struct {
		HostName string `json:"host-name"`
	}
	if err := AgentCall(context.Background(), sock, "guest-get-host-name", nil, &host); err != nil {
		t.Fatal(err)
	}
	if host.HostName != "vm-1" {
		t.Errorf("host name %q, want vm-1 (a stale answer was taken?)", host.HostName)
	}
	err := AgentCall(context.Background(), sock, "guest-nonsense", nil, nil)
	var ce *CommandError
	if !errors.As(err, &ce) || ce.Class != "CommandNotFound" || IsTimeout(err) {
		t.Errorf("unknown command: %v, want a CommandNotFound error", err)
	}
}

func TestAgentCallTimesOutOnASilentAgent(t *testing.T) {
	sock := fakeAgent(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := AgentCall(ctx, sock, "guest-ping", nil, nil)
	if !IsTimeout(err) {
		t.Errorf("silent agent: %v, want a timeout", err)
	}
}

func TestMachineArgs(t *testing.T) {
	m := Machine{Name: "1000-runner", Cores: 2, MemoryMiB: 2048, Kernel: "/k", Initrd: "/i", Append: KernelArgs(),
		Disk: "/d.qcow2", CDROM: "/seed.iso", CDROMID: "ide2", MAC: "bc:24:11:00:00:01",
		Net: UserNet{Net: "10.99.0.0/24", Host: "10.99.0.2", DNS: "10.99.0.3", Guest: "10.99.0.10"}, Console: "/c.log", SocketDir: "/s"}
	args := strings.Join(m.Args(), " ")
	for _, want := range []string{
		"-machine pc,accel=tcg", "-smp 2 -m 2048", "-kernel /k -initrd /i -append root=LABEL=hyperfleet-root",
		"file=/d.qcow2,if=none,id=drive-scsi0,format=qcow2",
		"user,id=net0,net=10.99.0.0/24,host=10.99.0.2,dns=10.99.0.3,dhcpstart=10.99.0.10",
		"virtio-net-pci,netdev=net0,id=net0,mac=bc:24:11:00:00:01",
		"socket,id=qga0,path=/s/qga.sock,server=on,wait=off", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
		"socket,id=qmp,path=/s/qmp.sock,server=on,wait=off", "file,id=serial0,path=/c.log,append=on",
		"file=/seed.iso,if=none,id=drive-ide2,media=cdrom,readonly=on", "scsi-cd,bus=scsihw0.0,drive=drive-ide2,id=ide2",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("QEMU arguments lack %q:\n%s", want, args)
		}
	}
	m.CDROM, m.CDROMID = "", ""
	if slices.ContainsFunc(m.Args(), func(a string) bool { return strings.Contains(a, "scsi-cd") }) {
		t.Error("a CD-ROM without an ISO or a drive id")
	}
}
