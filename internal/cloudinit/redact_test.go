package cloudinit

import (
	"errors"
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// renderCanary stands for the VM's notice token, the one secret the
// variables still hold (no credential is ever a variable); no render error
// may show it.
const renderCanary = "CANARY-ci-7b3e01"

// TestRenderErrorsNeverEchoSecrets: user templates that fail where the
// message quotes rendered text never get the notice token into the error,
// yet the error still names the field and line to fix.
func TestRenderErrorsNeverEchoSecrets(t *testing.T) {
	v := baseVars()
	v.PowerOffNotify = &agentconfig.PowerOffNotify{URL: "https://op.example.com/hints/v1/power-off", Token: renderCanary,
		Claim: agentconfig.ClaimRef{Namespace: "ci", Name: "runner-abc12", UID: v.InstanceID}}
	cases := []struct {
		name  string
		in    Input
		field string
	}{
		{"user data starting with the token", Input{UserData: "{{ .PowerOffNotify.Token }}\nruncmd: []\n"}, FieldUserData},
		{"the token as a repeated key", Input{UserData: "#cloud-config\n\"{{ .PowerOffNotify.Token }}\": 1\n\"{{ .PowerOffNotify.Token }}\": 2\n"}, FieldUserData},
		{"the token as a reserved-looking key", Input{UserData: "#cloud-config\nwrite_files: [{path: /etc/hyperfleet/agent.json, content: \"{{ .PowerOffNotify.Token }}\"}]\n"}, FieldUserData},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := c.in
			in.Vars = v
			_, err := Render(in)
			if err == nil {
				t.Fatal("Render succeeded; the test needs a failing template")
			}
			if strings.Contains(err.Error(), renderCanary) || strings.Contains(err.Error(), renderCanary[:10]) {
				t.Errorf("the error shows the token: %v", err)
			}
			var ce *Error
			if !errors.As(err, &ce) || ce.Field != c.field {
				t.Errorf("error %v does not name field %s", err, c.field)
			}
		})
	}
}
