package vmspec

import (
	"reflect"
	"testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestTPM: a TPM 2.0 is asked of the VM, and of its template, under
// attestation method tpm only; addVirtualTPM says whether to add one.
func TestTPM(t *testing.T) {
	tmpl := func(a hfv1.Attestation) *hfv1.HypervisorMachineTemplate {
		tm := &hfv1.HypervisorMachineTemplate{}
		tm.Name = "t"
		tm.Spec.Attestation = a
		tm.Spec.Source.Proxmox.TemplateName = "base"
		return tm
	}
	cases := []struct {
		name string
		a    hfv1.Attestation
		want *provider.VMTPM
	}{
		{"none", hfv1.Attestation{Method: hfv1.AttestationNone}, nil},
		{"unset", hfv1.Attestation{}, nil},
		{"join-token", hfv1.Attestation{Method: hfv1.AttestationJoinToken}, nil},
		{"tpm, template's own", hfv1.Attestation{Method: hfv1.AttestationTPM}, &provider.VMTPM{}},
		{"tpm, tpm block without add", hfv1.Attestation{Method: hfv1.AttestationTPM, TPM: &hfv1.TPMAttestation{DevicePath: "/dev/tpmrm0"}}, &provider.VMTPM{}},
		{"tpm, added", hfv1.Attestation{Method: hfv1.AttestationTPM, TPM: &hfv1.TPMAttestation{AddVirtualTPM: true}}, &provider.VMTPM{Add: true}},
	}
	claim := &hfv1.MachineClaim{}
	claim.Name, claim.Namespace, claim.UID = "c", "ns", "uid-1"
	for _, tc := range cases {
		tm := tmpl(tc.a)
		if got := Source(tm, proxmoxCluster()).TPM; !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: Source().TPM = %+v, want %+v", tc.name, got, tc.want)
		}
		spec, err := For(claim, tm, proxmoxCluster(), nil)
		if err != nil {
			t.Fatalf("%s: For: %v", tc.name, err)
		}
		if !reflect.DeepEqual(spec.TPM, tc.want) {
			t.Errorf("%s: VMSpec.TPM = %+v, want %+v", tc.name, spec.TPM, tc.want)
		}
	}
}

// TestTemplateHashAddVirtualTPM: turning addVirtualTPM on makes existing
// VMs stale (they have no TPM of their own); a template without it keeps
// the hash it had before the field was hashed.
func TestTemplateHashAddVirtualTPM(t *testing.T) {
	ws := githubsimtest.Backends(t, nil)
	hash := func(a hfv1.Attestation) string {
		tm := &hfv1.HypervisorMachineTemplate{}
		tm.Spec.Attestation = a
		h, err := TemplateHash(ws, tm, proxmoxCluster(), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	own := hash(hfv1.Attestation{Method: hfv1.AttestationTPM, TPM: &hfv1.TPMAttestation{}})
	added := hash(hfv1.Attestation{Method: hfv1.AttestationTPM, TPM: &hfv1.TPMAttestation{AddVirtualTPM: true}})
	if own == added {
		t.Error("addVirtualTPM does not change the template hash")
	}
}
