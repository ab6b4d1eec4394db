package qemucpu

import (
	"strings"
	"testing"
)

// TestCheck follows validate_vm_cpu_conf (qemu-server
// src/PVE/QemuServer/CPUConfig.pm: stable-bookworm lines 311-337, master
// lines 474-503) per version: nested-virt and the models PVE 9 added are
// refused by PVE 8, vmx by both (only the VM-specific flags pass).
func TestCheck(t *testing.T) {
	custom := func(name string) bool { return name == "avx-box" }
	cases := []struct {
		major int
		value string
		want  string // "" = accepted; else a fragment of the error
	}{
		{8, "host", ""},
		{8, "cputype=host,flags=+aes;-pcid", ""},
		{8, "x86-64-v2-AES", ""},
		{8, "host,flags=+nested-virt", "VM-specific CPU flags must be a subset of: aes, amd-no-ssb"},
		{8, "host,flags=+vmx", "VM-specific CPU flags must be a subset of"},
		{8, "EPYC-Turin", "Built-in cputype 'EPYC-Turin' is not defined"},
		{8, "custom-avx-box", ""},
		{8, "custom-other", "Custom cputype 'other' not found"},
		{8, "flags=+aes", "CPU is missing cputype"},
		{8, "host,guest-phys-bits=40", "property 'guest-phys-bits' is not defined"},
		{8, "host,reported-model=kvm64", "'reported-model' not allowed"},
		{8, "host,flags=aes", "subset of"},
		{9, "host,flags=+nested-virt", ""},
		{9, "x86-64-v3,flags=+nested-virt;+md-clear", ""},
		{9, "EPYC-Turin", ""},
		{9, "host,flags=+svm", "VM-specific CPU flags must be a subset of: aes, amd-no-ssb, amd-ssbd, hv-evmcs, hv-tlbflush, ibpb, md-clear, nested-virt"},
		{9, "Skylake-Server,guest-phys-bits=40", ""},
	}
	for _, tc := range cases {
		err := Check(tc.major, tc.value, custom)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("PVE %d, cpu %q: error %q, want %q", tc.major, tc.value, got, tc.want)
		}
	}
}

// TestOptionRoundTrip: a template's cpu option keeps its other keys and
// prints cputype first by its key.
func TestOptionRoundTrip(t *testing.T) {
	o := Parse("kvm64,hidden=1,flags=+aes")
	o.Set("cputype", "host")
	o.Set("phys-bits", "host")
	if got, want := o.String(), "cputype=host,hidden=1,flags=+aes,phys-bits=host"; got != want {
		t.Fatalf("option %q, want %q", got, want)
	}
}
