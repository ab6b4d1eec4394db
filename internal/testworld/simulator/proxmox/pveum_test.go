package proxmoxsim

import (
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// TestPveumGrantsWhatItSays: a role, a user, its ACL entry and a token made
// with pveum's command lines are what the API then enforces for that
// token, and a role appended to later widens it at once. Mutations:
// aclmod that records nothing leaves the token refused; role modify
// --append that replaces instead keeps VM.Audit from the token.
func TestPveumGrantsWhatItSays(t *testing.T) {
	e := newEnv(t, nil)
	run := func(line ...string) string {
		t.Helper()
		out, err := e.sim.Pveum(line)
		if err != nil {
			t.Fatalf("pveum %s: %v", strings.Join(line, " "), err)
		}
		return out
	}
	run("role", "add", "HyperFleet", "--privs", "VM.Audit Sys.Audit")
	run("user", "add", "hyperfleet@pve", "--comment", "HyperFleet operator")
	run("aclmod", "/", "--users", "hyperfleet@pve", "--roles", "HyperFleet")
	out := run("user", "token", "add", "hyperfleet@pve", "operator", "--privsep", "0")
	// The secret, read from the table as a reader copies it.
	m := regexp.MustCompile(`│ value +│ ([0-9a-f-]{36}) +│`).FindStringSubmatch(out)
	if m == nil || !regexp.MustCompile(`│ full-tokenid │ hyperfleet@pve!operator +│`).MatchString(out) || !strings.Contains(out, `{"privsep":"0"}`) {
		t.Fatalf("token add printed:\n%s", out)
	}
	e.auth = "PVEAPIToken=hyperfleet@pve!operator=" + m[1]
	if r := e.call(http.MethodGet, "/nodes/pve1/qemu/9000/config", nil); r.code != http.StatusOK {
		t.Fatalf("the token with VM.Audit on / reads a config: %s", r.status)
	}
	pool := func() apiResp { return e.call(http.MethodGet, "/pools/ci", nil) }
	if r := pool(); r.code != http.StatusForbidden {
		t.Fatalf("the token without Pool.Audit reads a pool: %s", r.status)
	}
	run("role", "modify", "HyperFleet", "--append", "--privs", "Pool.Audit")
	if r := pool(); r.code == http.StatusForbidden {
		t.Fatalf("Pool.Audit appended to the role is not the token's: %s", r.status)
	}
	if r := e.call(http.MethodGet, "/nodes/pve1/qemu/9000/config", nil); r.code != http.StatusOK {
		t.Fatalf("--append dropped the role's other privileges: %s", r.status)
	}
}

// TestPveumRefusesAsProxmoxDoes: pveum's errors for what step 2 of
// docs/install.md could get wrong: a privilege the version does not have
// (PVE 8's VM.Monitor on 9), a role twice, an ACL naming an unknown role or
// user, a second token of one name, an unknown option.
func TestPveumRefusesAsProxmoxDoes(t *testing.T) {
	e := newEnv(t, nil, WithAdmin(true))
	if _, err := e.sim.Pveum([]string{"role", "add", "R", "--privs", "VM.Audit"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.sim.Pveum([]string{"user", "add", "u@pve"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.sim.Pveum([]string{"user", "token", "add", "u@pve", "tk"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		line []string
		want string
	}{
		{[]string{"role", "add", "Old", "--privs", "VM.Monitor"}, "invalid privilege 'VM.Monitor'"},
		{[]string{"role", "add", "R", "--privs", "VM.Audit"}, "role 'R' already exists"},
		{[]string{"role", "add", "PVEAdmin"}, "role 'PVEAdmin' already exists"},
		{[]string{"role", "modify", "Nope", "--privs", "VM.Audit"}, "role 'Nope' does not exist"},
		{[]string{"aclmod", "/", "--users", "u@pve", "--roles", "Nope"}, "role 'Nope' does not exist"},
		{[]string{"aclmod", "/", "--users", "nobody@pve", "--roles", "R"}, "user 'nobody@pve' does not exist"},
		{[]string{"aclmod", "/", "--roles", "R"}, "either 'users', 'groups' or 'tokens' is required"},
		{[]string{"user", "add", "u@pve"}, "user 'u@pve' already exists"},
		{[]string{"user", "add", "v@ldap"}, "authentication domain 'ldap' does not exist"},
		{[]string{"user", "token", "add", "u@pve", "tk"}, "Token already exists."},
		{[]string{"user", "add", "w@pve", "--colour", "blue"}, "colour: property is not defined in schema"},
		{[]string{"user", "delete", "u@pve"}, "unknown command"},
	} {
		if _, err := e.sim.Pveum(c.line); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("pveum %s: %v, want %q", strings.Join(c.line, " "), err, c.want)
		}
	}
	// The JSON output, and the admin API's route to the same.
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/_sim/pveum", strings.NewReader(`["user","token","add","u@pve","js","--output-format","json"]`))
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		FullTokenID string `json:"full-tokenid"`
		Value       string `json:"value"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || got.FullTokenID != "u@pve!js" || len(got.Value) != 36 {
		t.Fatalf("POST /_sim/pveum: %s %+v %v", resp.Status, got, err)
	}
}
