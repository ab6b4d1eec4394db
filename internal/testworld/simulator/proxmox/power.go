package proxmoxsim

import (
	"fmt"
	"strconv"
	"time"
)

var (
	startSchema = sch(nodeP, vmidP,
		param{name: "skiplock", kind: kBool, optional: true},
		param{name: "timeout", kind: kInt, optional: true, min: intPtr(0), max: intPtr(86400)},
		param{name: "machine", kind: kString, optional: true},
		param{name: "force-cpu", kind: kString, optional: true},
	)
	stopSchema = sch(nodeP, vmidP,
		param{name: "skiplock", kind: kBool, optional: true},
		param{name: "timeout", kind: kInt, optional: true, min: intPtr(0)},
		param{name: "keepActive", kind: kBool, optional: true},
		param{name: "overrule-shutdown", kind: kBool, optional: true},
	)
	shutdownSchema = sch(nodeP, vmidP,
		param{name: "skiplock", kind: kBool, optional: true},
		param{name: "timeout", kind: kInt, optional: true, min: intPtr(0)},
		param{name: "forceStop", kind: kBool, optional: true},
		param{name: "keepActive", kind: kBool, optional: true},
	)
	destroySchema = sch(nodeP, vmidP,
		param{name: "purge", kind: kBool, optional: true},
		param{name: "destroy-unreferenced-disks", kind: kBool, optional: true},
		param{name: "skiplock", kind: kBool, optional: true},
	)
)

// handleStart is POST .../status/start. Everything but the config's
// existence is checked inside the qmstart task, as vm_start does: starting
// a template returns a UPID whose task fails.
func (s *Simulator) handleStart(q *apiRequest) (any, error) {
	return s.schedulePowerTaskLocked(q, "qmstart", s.cfg.Latency.Start.D(), func(v *vm, skiplock bool, t *task, at time.Time) {
		t.finish(at, s.startLocked(v, skiplock, t, at))
	})
}

// schedulePowerTaskLocked checks what a power call checks synchronously
// (skiplock rights, the VM on this node), creates the task and runs work
// when the latency d has passed.
func (s *Simulator) schedulePowerTaskLocked(q *apiRequest, typ string, d time.Duration, work func(v *vm, skiplock bool, t *task, at time.Time)) (any, error) {
	if err := checkSkiplock(q); err != nil {
		return nil, err
	}
	v, err := s.vmOnNodeLocked(q)
	if err != nil {
		return nil, err
	}
	skiplock := q.boolean("skiplock", false)
	t := s.newTaskLocked(v.node, typ, strconv.Itoa(v.vmid), q.auth)
	s.afterLocked(d, func(at time.Time) {
		if err := s.taskFaultLocked(classPower, strconv.Itoa(v.vmid), ""); err != nil {
			t.finish(at, err)
			return
		}
		work(v, skiplock, t, at)
	})
	return t.upid, nil
}

func (s *Simulator) startLocked(v *vm, skiplock bool, t *task, at time.Time) error {
	if s.vms[v.vmid] != v {
		return fmt.Errorf("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", v.node, v.vmid) //nolint:staticcheck,revive // ST1005/error-strings: Proxmox's own message, verbatim on the wire
	}
	if v.isTemplate() {
		return fmt.Errorf("you can't start a vm if it's a template")
	}
	// vm_start: a VM suspended to disk is resumed, whatever asked for the
	// start, and its lock is no obstacle.
	resume := v.conf["lock"] == lockSuspended || v.conf["vmstate"] != ""
	if !skiplock && v.conf["lock"] != lockSuspended {
		if l := v.conf["lock"]; l != "" {
			return fmt.Errorf("VM is locked (%s)", l)
		}
	}
	if v.running {
		return fmt.Errorf("VM %d already running", v.vmid)
	}
	if err := s.claimPCIDevicesLocked(v); err != nil {
		return err
	}
	n := s.nodes[v.node]
	if s.memUsedLocked(n)+v.memoryBytes() > n.memTotal {
		v.pciDevices = nil
		return fmt.Errorf("start failed: QEMU exited with code 1")
	}
	if cloudInitDriveKey(v) != "" {
		// qemu-server generates the drive's content at every start; a
		// cicustom snippet it cannot read fails the start.
		t.logf("generating cloud-init ISO")
		if _, err := s.nativeCloudInitLocked(v); err != nil {
			return err
		}
	}
	if v.ipv4 == "" {
		v.ipv4 = s.addrs.allocate(v.vmid)
	}
	if resume {
		return s.resumeFromDiskLocked(v, t, at)
	}
	if v.image != nil {
		return s.startRealGuestLocked(v, at)
	}
	s.lastPID++
	v.running, v.startedAt, v.pid, v.agentUp = true, at, s.lastPID, false
	v.bootGen++
	gen := v.bootGen
	if s.guest != nil {
		s.scheduleGuestProgramLocked(v, gen, at)
	}
	s.scheduleAgentLocked(v, gen, at)
	return nil
}

// scheduleGuestProgramLocked starts the guest program of boot gen, which
// stands for cloud-init and the agent: with a GuestStart latency once the
// modelled guest has booted that far (scheduled before the guest agent's
// event, so at equal times the seed is read first, as cloud-init reads it
// before the operator may eject it), else at once.
func (s *Simulator) scheduleGuestProgramLocked(v *vm, gen int, at time.Time) {
	if d := s.cfg.Latency.GuestStart.D(); d > 0 {
		s.scheduleLocked(at.Add(d), func(time.Time) {
			if s.vms[v.vmid] == v && v.running && v.bootGen == gen {
				s.guest.startLocked(v, gen)
			}
		})
		return
	}
	s.guest.startLocked(v, gen)
}

// scheduleAgentLocked has the guest agent of boot gen answer once the
// modelled boot is over.
func (s *Simulator) scheduleAgentLocked(v *vm, gen int, at time.Time) {
	s.scheduleLocked(at.Add(s.cfg.Latency.Boot.D()), func(time.Time) {
		if s.vms[v.vmid] == v && v.running && v.bootGen == gen {
			v.agentUp = true
		}
	})
}

// startRealGuestLocked boots a real guest's QEMU; its guest agent is up
// when it answers, not after a modelled boot time.
func (s *Simulator) startRealGuestLocked(v *vm, at time.Time) error {
	r, err := s.realGuestsLocked()
	if err != nil {
		return fmt.Errorf("start failed: %w", err)
	}
	gen := v.bootGen + 1
	if err := r.startLocked(v, gen); err != nil {
		return err
	}
	v.running, v.startedAt, v.pid, v.agentUp = true, at, r.vms[v.vmid].proc.Pid(), false
	v.bootGen = gen
	return nil
}

// powerOffLocked ends a VM's run, whatever caused it (stop, shutdown, the
// guest powering off, destroy).
func (s *Simulator) powerOffLocked(v *vm) {
	if !v.running {
		return
	}
	v.running, v.agentUp, v.pid, v.paused, v.saved = false, false, 0, false, nil
	v.pciDevices = nil
	v.guestFiles = nil
	v.bootGen++
	if s.guest != nil {
		s.guest.stopLocked(v.vmid)
	}
	if s.real != nil {
		s.real.stopLocked(v.vmid)
	}
}

// handleStop is POST .../status/stop (task qmstop).
func (s *Simulator) handleStop(q *apiRequest) (any, error) {
	return s.powerTask(q, "qmstop", s.cfg.Latency.Stop.D())
}

// handleShutdown is POST .../status/shutdown (task qmshutdown). A
// simulated guest always honours the ACPI request; a real guest is sent it
// and the task waits until the guest powered off (timeout, default 180 s,
// then forceStop decides).
func (s *Simulator) handleShutdown(q *apiRequest) (any, error) {
	timeout := time.Duration(q.integer("timeout", 180)) * time.Second
	force := q.boolean("forceStop", false)
	// vm_shutdown: an ACPI request to a paused guest would wait for the
	// timeout and power it off once resumed; with forceStop it is
	// stopped instead.
	if v, err := s.vmOnNodeLocked(q); err == nil && v.paused && !force {
		return nil, serverError("VM is paused - cannot shutdown")
	}
	return s.powerTask(q, "qmshutdown", s.cfg.Latency.Shutdown.D(), func(v *vm, t *task) bool {
		return s.real != nil && s.real.shutdownLocked(v, t, timeout, force)
	})
}

// powerTask schedules a stop or shutdown. takeOver, when set, may take over a
// real guest's task (and finish it itself); it reports whether it did.
func (s *Simulator) powerTask(q *apiRequest, typ string, d time.Duration, takeOver ...func(v *vm, t *task) bool) (any, error) {
	return s.schedulePowerTaskLocked(q, typ, d, func(v *vm, skiplock bool, t *task, at time.Time) {
		if s.vms[v.vmid] != v {
			t.finish(at, fmt.Errorf("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", v.node, v.vmid)) //nolint:staticcheck,revive // ST1005/error-strings: Proxmox's own message, verbatim on the wire
			return
		}
		if !v.running {
			// _do_vm_stop returns before its lock check when QEMU does
			// not run: a stopped VM, a suspended one among them, is left
			// as it is.
			t.finish(at, nil)
			return
		}
		if !skiplock {
			if l := v.conf["lock"]; l != "" {
				t.finish(at, fmt.Errorf("VM is locked (%s)", l))
				return
			}
		}
		if len(takeOver) > 0 && v.running && takeOver[0](v, t) {
			return
		}
		s.powerOffLocked(v)
		t.finish(at, nil)
	})
}

// handleDestroy is DELETE /nodes/{node}/qemu/{vmid} (task qmdestroy).
func (s *Simulator) handleDestroy(q *apiRequest) (any, error) {
	if err := checkSkiplock(q); err != nil {
		return nil, err
	}
	v, err := s.vmOnNodeLocked(q)
	if err != nil {
		return nil, err
	}
	if v.conf["protection"] == "1" {
		return nil, serverError("can't remove VM %d - protection mode enabled", v.vmid)
	}
	if v.running {
		return nil, serverError("VM %d is running - destroy failed", v.vmid)
	}
	// destroy_vm (QemuServer.pm) ignores "suspended" ("fix #4358"): the
	// saved state goes with the disks.
	if !q.boolean("skiplock", false) && v.conf["lock"] != lockSuspended {
		if err := checkLock(v); err != nil {
			return nil, err
		}
	}
	// The config stays as a "lock: destroyed" stub until the task removed
	// the disks.
	lock, locked := v.conf["lock"]
	v.conf["lock"] = "destroyed"
	t := s.newTaskLocked(v.node, "qmdestroy", strconv.Itoa(v.vmid), q.auth)
	s.afterLocked(s.cfg.Latency.Destroy.D(), func(at time.Time) {
		if err := s.taskFaultLocked(classDestroy, strconv.Itoa(v.vmid), ""); err != nil {
			// The worker failed before removing anything: the VM stays
			// as it was.
			if locked {
				v.conf["lock"] = lock
			} else {
				delete(v.conf, "lock")
			}
			t.finish(at, err)
			return
		}
		for _, volid := range s.volumesOwnedLocked(v) {
			if st, vol := s.findVolumeLocked(volid, v.node); vol != nil {
				s.freeVolumeLocked(st, vol)
				t.logf("Removed volume '%s'", volid)
			}
		}
		for _, p := range s.pools {
			delete(p.members, v.vmid)
		}
		s.addrs.release(v.vmid)
		// The real guest first: it may keep its disk (Guest.KeepDisks)
		// from the directory both remove.
		if s.real != nil {
			s.real.forgetLocked(v.vmid)
		}
		if s.guest != nil {
			s.guest.forgetLocked(v.vmid)
		}
		delete(s.vms, v.vmid)
		s.forgetFirewallLocked(v.vmid) // remove_vmfw_conf
		s.firewallChangedLocked()
		t.finish(at, nil)
	})
	return t.upid, nil
}
