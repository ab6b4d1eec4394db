package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/qemu"
)

// Bounds of the template's first boot under emulation; measured on 2
// shared cores: about 40 s to the guest agent, 2 to 3 minutes for the
// recipe (package index download included).
const (
	agentTimeout     = 10 * time.Minute
	cloudInitTimeout = 30 * time.Minute
	powerOffTimeout  = 5 * time.Minute
)

// buildTemplate is docs/templates.md steps 2 and 3 on the base image: boot
// it with the recipe as NoCloud user-data, wait for cloud-init as
// `qm guest exec ... cloud-init status --wait` does, run the seal program
// through the guest agent, shut down, and keep the disk.
func buildTemplate(ctx context.Context, out, base string, r recipe) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "guest-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	overlay := filepath.Join(work, "disk.qcow2")
	if err := run("qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", filepath.Join(base, "disk.raw"), overlay); err != nil {
		return err
	}
	seed := filepath.Join(work, "seed.iso")
	if err := qemu.WriteNoCloudISO(seed, map[string][]byte{
		"user-data":      r.cloudConfig,
		"meta-data":      []byte("instance-id: hyperfleet-template-build\nlocal-hostname: template-build\n"),
		"network-config": []byte("version: 2\nethernets:\n  eth0:\n    dhcp4: true\n"),
	}); err != nil {
		return err
	}
	m := qemu.Machine{Name: "guest-image", Cores: 2, MemoryMiB: 2048,
		Kernel: filepath.Join(base, "vmlinuz"), Initrd: filepath.Join(base, "initrd.img"), Append: qemu.KernelArgs(),
		Disk: overlay, CDROM: seed, MAC: "bc:24:11:00:00:01", Console: filepath.Join(work, "console.log"), SocketDir: work}
	start := time.Now()
	progress("booting the base image with the recipe of docs/templates.md step 2 (QEMU, console %s)", m.Console)
	p, err := qemu.Start(m)
	if err != nil {
		return err
	}
	defer p.Kill()
	fail := func(err error) error {
		console, _ := os.ReadFile(m.Console)
		if len(console) > 8000 {
			console = console[len(console)-8000:]
		}
		return fmt.Errorf("%w\nconsole tail:\n%s", err, console)
	}
	actx, cancel := context.WithTimeout(ctx, agentTimeout)
	err = qemu.WaitAgent(actx, m.AgentSocket(), p.Done())
	cancel()
	if err != nil {
		return fail(err)
	}
	progress("guest agent up after %s; waiting for cloud-init", time.Since(start).Round(time.Second))
	cctx, cancel := context.WithTimeout(ctx, cloudInitTimeout)
	res, err := qemu.AgentExec(cctx, m.AgentSocket(), "cloud-init", "status", "--wait", "--long")
	cancel()
	if err != nil {
		return fail(err)
	}
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "status: done") {
		log, _ := qemu.AgentExec(ctx, m.AgentSocket(), "tail", "-n", "60", "/var/log/cloud-init-output.log")
		return fail(fmt.Errorf("cloud-init status exited %d:\n%s%s\ncloud-init-output.log:\n%s", res.ExitCode, res.Stdout, res.Stderr, log.Stdout))
	}
	progress("recipe done after %s; sealing (docs/templates.md step 3)", time.Since(start).Round(time.Second))
	res, err = qemu.AgentExec(ctx, m.AgentSocket(), "sh", "-c", r.seal)
	if err != nil {
		return fail(err)
	}
	if res.ExitCode != 0 {
		return fail(fmt.Errorf("seal exited %d: %s%s", res.ExitCode, res.Stdout, res.Stderr))
	}
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = qemu.QMP(qctx, m.QMPSocket(), "system_powerdown", nil)
	cancel()
	if err != nil {
		return fail(err)
	}
	select {
	case <-p.Done():
	case <-time.After(powerOffTimeout):
		return fail(fmt.Errorf("the guest did not power off within %s of the power button", powerOffTimeout))
	}
	progress("powered off after %s; writing the template disk", time.Since(start).Round(time.Second))
	return run("qemu-img", "convert", "-O", "raw", overlay, filepath.Join(out, "disk.raw"))
}
