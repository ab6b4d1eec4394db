package vmspec

import (
	"net"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

func TestHostnameFor(t *testing.T) {
	long := strings.Repeat("a", 70)
	cases := []struct {
		ns, name string
		strategy hfv1.HostnameStrategy
		want     string
	}{
		{"ci", "runner-1", hfv1.HostnameFromName, "runner-1"},
		{"ci", "runner-1", "", "runner-1"},
		{"ci", "runner-1", hfv1.HostnameFromNamespaceAndName, "ci-runner-1"},
		{"ci", "Runner.v2", hfv1.HostnameFromName, "runner-v2"},
		{"ci", "...", hfv1.HostnameFromName, ""},
	}
	for _, tc := range cases {
		got := Hostname(&hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: tc.ns, Name: tc.name}}, tc.strategy)
		if tc.want != "" && got != tc.want {
			t.Errorf("Hostname(%s/%s, %q) = %q, want %q", tc.ns, tc.name, tc.strategy, got, tc.want)
		}
		if len(got) == 0 || len(got) > maxHostnameLength || strings.HasPrefix(got, "-") || strings.HasSuffix(got, "-") {
			t.Errorf("Hostname(%s/%s) = %q is not a DNS label", tc.ns, tc.name, got)
		}
	}
	a := Hostname(&hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Name: long + "x"}}, "")
	b := Hostname(&hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Name: long + "y"}}, "")
	if a == b || len(a) > maxHostnameLength || !strings.HasPrefix(a, "aaaa") {
		t.Errorf("long names: %q and %q must differ, fit 63 characters and keep their start", a, b)
	}
}

func TestMACForIsStableLocalUnicast(t *testing.T) {
	m1, m2 := MAC("uid-1"), MAC("uid-1")
	if m1 != m2 {
		t.Fatal("MAC changes between calls")
	}
	if MAC("uid-2") == m1 {
		t.Fatal("two claims share a MAC")
	}
	hw, err := net.ParseMAC(m1)
	if err != nil {
		t.Fatal(err)
	}
	if hw[0]&0x02 == 0 || hw[0]&0x01 != 0 {
		t.Fatalf("MAC %s is not locally administered unicast", m1)
	}
}
