package providertest

import (
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// testTPMTemplate: the suite's template has no TPM (the Harness contract);
// a source that needs the template's own TPM 2.0 is refused with
// ClassConfiguration, naming addVirtualTPM, and one that adds a TPM is
// accepted. Without a TPM need the template validates as before.
func testTPMTemplate(t *testing.T, h *Harness) {
	info, err := h.Provider.ValidateTemplate(t.Context(), h.Template)
	if err != nil {
		t.Fatalf("ValidateTemplate(%+v): %v", h.Template, err)
	}
	if info.TPM {
		t.Fatalf("ValidateTemplate: the suite's template reports a TPM; the Harness contract says it has none")
	}
	own := h.Template
	own.TPM = &provider.VMTPM{}
	_, err = h.Provider.ValidateTemplate(t.Context(), own)
	if err == nil {
		t.Fatalf("ValidateTemplate accepted a template without TPM for a VM that needs the template's TPM 2.0")
	}
	if cl := provider.Classify(err); cl != provider.ClassConfiguration {
		t.Errorf("ValidateTemplate without TPM: class %s, want %s (%v)", cl, provider.ClassConfiguration, err)
	}
	if !strings.Contains(err.Error(), "spec.attestation.tpm.addVirtualTPM") {
		t.Errorf("ValidateTemplate without TPM: %q does not name spec.attestation.tpm.addVirtualTPM, the field that fixes it", err)
	}
	add := h.Template
	add.TPM = &provider.VMTPM{Add: true}
	if _, err := h.Provider.ValidateTemplate(t.Context(), add); err != nil {
		t.Errorf("ValidateTemplate with a TPM to add: %v", err)
	}
}

// testAddedTPM: a VM whose spec adds a TPM reports one in GetVM once it
// runs; a VM of the same template that asks for none has none.
func testAddedTPM(t *testing.T, h *Harness) {
	with := spec(h.Template, 1)
	with.TPM = &provider.VMTPM{Add: true}
	without := spec(h.Template, 2)
	for _, c := range []struct {
		spec *provider.VMSpec
		want bool
	}{{with, true}, {without, false}} {
		res := newDrive(t, h, h.Provider, c.spec).toPhase(provider.PhaseRunning)
		vm, err := h.Provider.GetVM(t.Context(), res.Progress.VMRef())
		if err != nil {
			t.Fatalf("GetVM of %s: %v", c.spec.Name, err)
		}
		if vm.TPM != c.want {
			t.Errorf("GetVM of %s (spec TPM %+v): TPM %v, want %v", c.spec.Name, c.spec.TPM, vm.TPM, c.want)
		}
	}
}
