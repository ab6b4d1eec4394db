//go:build windows

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/windows/svc"
	"golang.org/x/sys/windows/svc/mgr"
)

// Defaults of a Windows VM (docs/windows.md): the config the cloudbase-init
// user data writes, the service's own account, and Windows' shutdown
// (planned, maintenance: /d p:4:1) without waiting (/t 0) or for
// applications that would hold it up (/f).
const (
	defaultConfigPath = `C:\ProgramData\HyperFleet\agent.json`
	defaultRunAs      = ""
	defaultPowerOff   = `shutdown.exe /s /t 0 /f /d p:4:1`
)

// serviceName is the Windows service the agent is installed as
// (docs/windows.md); the cloudbase-init user data starts it by this name
// (internal/cloudinit's WindowsServiceName).
const serviceName = "hyperfleet-agent"

// platformCommand runs `service install|uninstall`, and the agent itself
// when the service manager started the process.
func platformCommand(args []string, stdout, stderr io.Writer) (int, bool) {
	if len(args) > 0 && args[0] == "service" {
		c, err := parseServiceCommand(args[1:], filepath.IsAbs)
		if err == nil {
			if c.action == "install" {
				err = installService(c.args)
			} else {
				err = uninstallService()
			}
		}
		if err != nil {
			fmt.Fprintf(stderr, "hyperfleet-agent: %v\n", err)
			return 2, true
		}
		fmt.Fprintf(stdout, "hyperfleet-agent: service %s: %s done\n", serviceName, c.action)
		return 0, true
	}
	inService, err := svc.IsWindowsService()
	if err != nil {
		fmt.Fprintf(stderr, "hyperfleet-agent: cannot tell whether the service manager started it: %v\n", err)
		return 1, true
	}
	if !inService {
		return 0, false
	}
	h := &serviceHandler{args: args, stdout: stdout, stderr: stderr}
	if err := svc.Run(serviceName, h); err != nil {
		return 1, true
	}
	return h.code, true
}

// installService creates the service: started by hand (the user data
// starts it once: a reboot must not start a second job with a used
// credential, as the Linux unit is not enabled), as LocalSystem, never
// restarted by the service manager.
func installService(args []string) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this program: %w", err)
	}
	m, err := mgr.Connect()
	if err != nil {
		return fmt.Errorf("connecting to the service manager: %w", err)
	}
	defer func() { _ = m.Disconnect() }()
	if s, err := m.OpenService(serviceName); err == nil {
		s.Close()
		return fmt.Errorf("service %s exists already; uninstall it first", serviceName)
	}
	s, err := m.CreateService(serviceName, exe, mgr.Config{
		DisplayName: "HyperFleet agent",
		Description: "Runs one CI job, then shuts the VM down (docs/windows.md)",
		StartType:   mgr.StartManual,
	}, args...)
	if err != nil {
		return fmt.Errorf("creating service %s: %w", serviceName, err)
	}
	defer s.Close()
	return nil
}

func uninstallService() error {
	m, err := mgr.Connect()
	if err != nil {
		return fmt.Errorf("connecting to the service manager: %w", err)
	}
	defer func() { _ = m.Disconnect() }()
	s, err := m.OpenService(serviceName)
	if err != nil {
		return fmt.Errorf("opening service %s: %w", serviceName, err)
	}
	defer s.Close()
	if err := s.Delete(); err != nil {
		return fmt.Errorf("deleting service %s: %w", serviceName, err)
	}
	return nil
}

// serviceHandler runs the agent under the service manager: Stop and
// Shutdown cancel it (as SIGTERM does on Linux), and its exit code becomes
// the service's specific exit code (sc.exe query shows it).
type serviceHandler struct {
	args           []string
	stdout, stderr io.Writer
	code           int
}

func (h *serviceHandler) Execute(_ []string, requests <-chan svc.ChangeRequest, status chan<- svc.Status) (bool, uint32) {
	status <- svc.Status{State: svc.StartPending}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() { done <- runAgent(ctx, h.args, h.stdout, h.stderr) }()
	status <- svc.Status{State: svc.Running, Accepts: svc.AcceptStop | svc.AcceptShutdown}
	for {
		select {
		case h.code = <-done:
			status <- svc.Status{State: svc.StopPending}
			return h.code != 0, uint32(h.code)
		case r := <-requests:
			switch r.Cmd {
			case svc.Interrogate:
				status <- r.CurrentStatus
			case svc.Stop, svc.Shutdown:
				status <- svc.Status{State: svc.StopPending, WaitHint: uint32((30 * time.Second).Milliseconds())}
				cancel()
			}
		}
	}
}
