package main

import (
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Linux input event codes (linux/input-event-codes.h).
const (
	evKey    = 1
	keyPower = 116
)

// inputEventSize is struct input_event on 64-bit Linux: a timeval (16
// bytes), type and code (2 each) and value (4).
const inputEventSize = 24

// watchPowerButton powers the guest off when the ACPI power button is
// pressed (libvirt's shutdown with the acpi-power-button mode), as systemd
// does on a real guest: it reads key events from the input device the
// ACPI button driver registers.
func watchPowerButton() {
	dev := powerButtonDevice()
	if dev == "" {
		logf("power button: no input device")
		return
	}
	f, err := os.Open(dev)
	if err != nil {
		logf("power button: %v", err)
		return
	}
	go func() {
		defer f.Close()
		ev := make([]byte, inputEventSize)
		for {
			if _, err := io.ReadFull(f, ev); err != nil {
				logf("power button: %v", err)
				return
			}
			if isPowerPress(ev) {
				logf("power button pressed")
				powerOff("powerdown")
			}
		}
	}()
}

// isPowerPress tells a key-down event of KEY_POWER.
func isPowerPress(ev []byte) bool {
	typ := binary.LittleEndian.Uint16(ev[16:])
	code := binary.LittleEndian.Uint16(ev[18:])
	value := int32(binary.LittleEndian.Uint32(ev[20:]))
	return typ == evKey && code == keyPower && value == 1
}

// powerButtonDevice finds /dev/input/eventN of the device named "Power
// Button" (there is no udev to name it).
func powerButtonDevice() string {
	names, _ := filepath.Glob("/sys/class/input/event*/device/name")
	for _, n := range names {
		raw, err := os.ReadFile(n)
		if err == nil && strings.TrimSpace(string(raw)) == "Power Button" {
			return "/dev/input/" + filepath.Base(filepath.Dir(filepath.Dir(n)))
		}
	}
	return ""
}
