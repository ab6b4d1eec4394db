package cloudinit

import (
	"errors"
	"strings"
	"testing"
)

// renderCanary stands for a VM's credential; no render error may show it.
const renderCanary = "CANARY-ci-7b3e01"

// TestRenderErrorsNeverEchoCredential: user templates that fail where the
// message quotes rendered text never get the credential into the error,
// yet the error still names the field and line to fix.
func TestRenderErrorsNeverEchoCredential(t *testing.T) {
	jit := baseVars()
	jit.JITConfig = renderCanary
	token := runnerTokenVars(baseVars())
	token.RunnerToken = renderCanary
	cases := []struct {
		name  string
		vars  Vars
		in    Input
		field string
	}{
		{"user data starting with the JIT config", jit, Input{UserData: "{{ .JITConfig }}\nruncmd: []\n"}, FieldUserData},
		{"user data starting with the registration token", token, Input{UserData: "{{ .RunnerToken }}\n"}, FieldUserData},
		{"the JIT config as a repeated key", jit, Input{UserData: "#cloud-config\n\"{{ .JITConfig }}\": 1\n\"{{ .JITConfig }}\": 2\n"}, FieldUserData},
		{"the JIT config as a reserved-looking key", jit, Input{UserData: "#cloud-config\nwrite_files: [{path: /etc/hyperfleet/agent.json, content: \"{{ .JITConfig }}\"}]\n"}, FieldUserData},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := c.in
			in.Vars = c.vars
			_, err := Render(in)
			if err == nil {
				t.Fatal("Render succeeded; the test needs a failing template")
			}
			if strings.Contains(err.Error(), renderCanary) || strings.Contains(err.Error(), renderCanary[:10]) {
				t.Errorf("the error shows the credential: %v", err)
			}
			var ce *Error
			if !errors.As(err, &ce) || ce.Field != c.field {
				t.Errorf("error %v does not name field %s", err, c.field)
			}
		})
	}
}
