package proxmoxsim

import (
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestErrorResponses checks status lines, bodies and messages of Proxmox's
// error answers: 501 for an unknown path or method, 403 "Permission check
// failed (<path>, <privilege>)" before any existence check, 400 "Parameter
// verification failed." with one message per parameter, and 500 with the
// handler's message (such as "Configuration file
// 'nodes/<node>/qemu-server/<vmid>.conf' does not exist") in the status
// line.
func TestErrorResponses(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Users = append(c.Users, UserConfig{ID: "capmox@pve", Tokens: []TokenConfig{{ID: "capi", Secret: "s3cret"}},
			Privileges: Privileges{"/": {"Administrator"}}})
		c.Users[len(c.Users)-1].Tokens[0].Privileges = Privileges{"/vms/9000": {"VM.Audit", "VM.Clone"}, "/storage": {"Datastore.Audit"}}
	})
	limited := "PVEAPIToken=capmox@pve!capi=s3cret"
	long := strings.Repeat("x", 8193)
	tests := []struct {
		name       string
		method     string
		path       string
		params     url.Values
		auth       string
		wantCode   int
		wantStatus string
		wantErrors map[string]string
		wantMsg    string
	}{
		{name: "unknown path is 501 even unauthenticated", method: "GET", path: "/x", auth: "-",
			wantCode: 501, wantStatus: "501 Method 'GET /x' not implemented", wantMsg: "Method 'GET /x' not implemented\n"},
		{name: "unknown method on known path is 501", method: "PATCH", path: "/version",
			wantCode: 501, wantStatus: "501 Method 'PATCH /version' not implemented"},
		{name: "missing config is 500 with the file name", method: "GET", path: "/nodes/pve1/qemu/117/config",
			wantCode: 500, wantStatus: "500 Configuration file 'nodes/pve1/qemu-server/117.conf' does not exist",
			wantMsg: "Configuration file 'nodes/pve1/qemu-server/117.conf' does not exist\n"},
		{name: "permission check precedes existence check", method: "DELETE", path: "/nodes/pve1/qemu/100", auth: limited,
			wantCode: 403, wantStatus: "403 Permission check failed (/vms/100, VM.Allocate)"},
		{name: "clone needs VM.Allocate on newid", method: "POST", path: "/nodes/pve1/qemu/9000/clone", params: form("newid", "150"), auth: limited,
			// An 'or' group (/vms/{newid} or /pool/{pool}) fails without
			// naming anything (RPCEnvironment.pm exec_api2_perm_check).
			wantCode: 403, wantStatus: "403 Permission check failed"},
		// update_vm's entry check (qemu-server Qemu.pm: any of
		// $vm_config_perm_list) fails before the per-option one.
		{name: "config changes need a VM.Config privilege", method: "PUT", path: "/nodes/pve1/qemu/9000/config", params: form("tags", "a"), auth: limited,
			wantCode: 403, wantStatus: "403 Permission check failed (/vms/9000, VM.Config.Disk|VM.Config.CDROM|VM.Config.CPU|VM.Config.Memory|VM.Config.Network|VM.Config.HWType|VM.Config.Options|VM.Config.Cloudinit)"},
		{name: "cluster status needs Sys.Audit on /", method: "GET", path: "/cluster/status", auth: limited,
			wantCode: 403, wantStatus: "403 Permission check failed (/, Sys.Audit)"},
		{name: "missing required parameter", method: "POST", path: "/nodes/pve1/qemu/9000/clone",
			wantCode: 400, wantStatus: "400 Parameter verification failed.", wantMsg: "Parameter verification failed.\n",
			wantErrors: map[string]string{"newid": "property is missing and it is not optional"}},
		{name: "unknown parameter", method: "POST", path: "/nodes/pve1/qemu/9000/clone", params: form("newid", "101", "tags", "x"),
			wantCode: 400, wantErrors: map[string]string{"tags": "property is not defined in schema and the schema does not allow additional properties"}},
		{name: "description too long", method: "PUT", path: "/nodes/pve1/qemu/9000/config", params: form("description", long),
			wantCode: 400, wantErrors: map[string]string{"description": "value may only be 8192 characters long"}},
		{name: "illegal tag characters", method: "PUT", path: "/nodes/pve1/qemu/9000/config", params: form("tags", "hyperfleet.io/managed-by=op1"),
			wantCode: 400, wantErrors: map[string]string{"tags": "invalid format - invalid characters in tag\n"}},
		{name: "booleans are only 0 and 1", method: "POST", path: "/nodes/pve1/qemu/9000/clone", params: form("newid", "101", "full", "true"),
			wantCode: 400, wantErrors: map[string]string{"full": "type check ('boolean') failed - got 'true'"}},
		{name: "name must be a DNS name", method: "POST", path: "/nodes/pve1/qemu/9000/clone", params: form("newid", "101", "name", "ci_runner"),
			wantCode: 400, wantErrors: map[string]string{"name": "invalid format - value does not look like a valid DNS name\n"}},
		{name: "vmid minimum", method: "GET", path: "/nodes/pve1/qemu/99/status/current",
			wantCode: 400, wantErrors: map[string]string{"vmid": "value must have a minimum value of 100"}},
		{name: "newid maximum", method: "POST", path: "/nodes/pve1/qemu/9000/clone", params: form("newid", "1000000000"),
			wantCode: 400, wantErrors: map[string]string{"newid": "value must have a maximum value of 999999999"}},
		{name: "vmid type", method: "GET", path: "/nodes/pve1/qemu/abc/config",
			wantCode: 400, wantErrors: map[string]string{"vmid": "type check ('integer') failed - got 'abc'"}},
		{name: "taken vmid in nextid", method: "GET", path: "/cluster/nextid", params: form("vmid", "9000"),
			wantCode: 400, wantErrors: map[string]string{"vmid": "VM 9000 already exists"}},
		{name: "unknown task", method: "GET", path: "/nodes/pve1/tasks/UPID:pve1:00000001:00000002:00000003:qmstart:100:root@pam:/status",
			wantCode: 400, wantErrors: map[string]string{"upid": "no such task"}},
		{name: "resources type enum", method: "GET", path: "/cluster/resources", params: form("type", "vms"),
			wantCode: 400, wantErrors: map[string]string{"type": "value 'vms' does not have a value in the enumeration 'vm, storage, node, sdn'"}},
		{name: "existing newid", method: "POST", path: "/nodes/pve1/qemu/9000/clone", params: form("newid", "9000"),
			wantCode: 500, wantStatus: "500 unable to create VM 9000: config file already exists"},
		{name: "storage not allowed for linked clones", method: "POST", path: "/nodes/pve1/qemu/9000/clone", params: form("newid", "101", "storage", "local-lvm"),
			wantCode: 500, wantStatus: "500 parameter 'storage' not allowed for linked clones"},
		{name: "unknown node", method: "GET", path: "/nodes/nope/status",
			wantCode: 500, wantStatus: "500 hostname lookup 'nope' failed - failed to get address info for: nope: Name or service not known"},
		{name: "statestorage requires todisk", method: "POST", path: "/nodes/pve1/qemu/9000/status/suspend", params: form("statestorage", "local"),
			wantCode: 400, wantErrors: map[string]string{"todisk": "missing property - 'statestorage' requires this property"}},
		{name: "suspend of a VM that does not run", method: "POST", path: "/nodes/pve1/qemu/9000/status/suspend", params: form("todisk", "1"),
			wantCode: 500, wantStatus: "500 VM 9000 not running"},
		{name: "resume of a VM that does not run", method: "POST", path: "/nodes/pve1/qemu/9000/status/resume",
			wantCode: 500, wantStatus: "500 VM 9000 not running"},
		{name: "skiplock is root only", method: "PUT", path: "/nodes/pve1/qemu/9000/config", params: form("skiplock", "1", "cores", "2"), auth: "PVEAPIToken=root@pam!sim=00000000-0000-0000-0000-000000000000",
			wantCode: 400, wantErrors: map[string]string{"skiplock": "Only root may use this option."}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e.t = t
			e.auth = rootToken
			if tc.auth == "-" {
				e.auth = ""
			} else if tc.auth != "" {
				e.auth = tc.auth
			}
			r := e.call(tc.method, tc.path, tc.params)
			if r.code != tc.wantCode {
				t.Fatalf("code: want %d, got %s: %s", tc.wantCode, r.status, r.raw)
			}
			if tc.wantStatus != "" && r.status != tc.wantStatus {
				t.Errorf("status line: want %q, got %q", tc.wantStatus, r.status)
			}
			if _, ok := r.body["data"]; !ok || r.body["data"] != nil {
				t.Errorf("errors carry \"data\":null, got %s", r.raw)
			}
			if tc.wantMsg != "" && r.body["message"] != tc.wantMsg {
				t.Errorf("message: want %q, got %q", tc.wantMsg, r.body["message"])
			}
			if tc.wantErrors != nil {
				got := r.errors()
				if len(got) != len(tc.wantErrors) {
					t.Errorf("errors: want %v, got %v", tc.wantErrors, got)
				}
				for k, v := range tc.wantErrors {
					if got[k] != v {
						t.Errorf("errors[%s]: want %q, got %q", k, v, got[k])
					}
				}
			}
		})
	}
}

func TestAuthentication(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.AuthFailureDelay = Duration(60 * time.Millisecond)
		c.Users = append(c.Users,
			UserConfig{ID: "ci@pve", Password: "pw", Privileges: Privileges{"/": {"PVEAuditor"}},
				Tokens: []TokenConfig{{ID: "eq", Secret: "a=b=c", Privsep: boolPtr(false)}, {ID: "old", Secret: "x", Expire: t0.Unix() - 1}}},
			UserConfig{ID: "off@pve", Password: "pw", Disabled: true, Tokens: []TokenConfig{{ID: "tk", Secret: "x"}}})
	})
	t.Run("401 has an empty body and is delayed", func(t *testing.T) {
		e.t, e.auth = t, ""
		start := time.Now()
		r := e.call("GET", "/version", nil)
		if r.code != 401 || r.status != "401 No ticket" || len(r.raw) != 0 {
			t.Fatalf("want empty 401 No ticket, got %s %q", r.status, r.raw)
		}
		if time.Since(start) < 60*time.Millisecond {
			t.Fatalf("401 was not delayed")
		}
	})
	for name, hdr := range map[string]string{
		"wrong secret":     "PVEAPIToken=root@pam!sim=wrong",
		"unknown token":    "PVEAPIToken=root@pam!nope=x",
		"malformed id":     "PVEAPIToken=root!sim=x",
		"expired token":    "PVEAPIToken=ci@pve!old=x",
		"disabled user":    "PVEAPIToken=off@pve!tk=x",
		"secret split off": "PVEAPIToken=ci@pve!eq=a",
	} {
		t.Run(name, func(t *testing.T) {
			e.t, e.auth = t, hdr
			if r := e.call("GET", "/version", nil); r.code != 401 || r.status != "401 Authentication failed!" || len(r.raw) != 0 {
				t.Fatalf("want 401 Authentication failed!, got %s %q", r.status, r.raw)
			}
		})
	}
	t.Run("token is split at the last equals sign", func(t *testing.T) {
		e.t, e.auth = t, "PVEAPIToken=ci@pve!eq=a=b=c"
		// The split at the LAST '=' makes the id "ci@pve!eq=a=b", which is
		// not a valid token id, so a secret containing '=' cannot be used.
		if r := e.call("GET", "/version", nil); r.code != 401 {
			t.Fatalf("want 401 for id with '=', got %s", r.status)
		}
	})
	t.Run("ticket login, CSRF and renewal", func(t *testing.T) {
		e.t, e.auth = t, ""
		r := e.mustOK(e.call("POST", "/access/ticket", form("username", "ci", "realm", "pve", "password", "pw")))
		d := r.dataMap(t)
		ticket, csrf := d["ticket"].(string), d["CSRFPreventionToken"].(string)
		if !regexp.MustCompile(`^PVE:ci@pve:[0-9A-F]{8}::\S+$`).MatchString(ticket) || d["username"] != "ci@pve" {
			t.Fatalf("bad ticket %q / user %v", ticket, d["username"])
		}
		if !regexp.MustCompile(`^[0-9A-F]{8}:\S+$`).MatchString(csrf) {
			t.Fatalf("bad CSRF token %q", csrf)
		}
		if _, ok := d["cap"].(map[string]any)["vms"]; !ok {
			t.Fatalf("cap lacks vms: %v", d["cap"])
		}
		cookie := "PVEAuthCookie=" + ticket
		e.mustOK(e.call("GET", "/version", nil, "Cookie", cookie))
		if r := e.call("POST", "/pools", form("poolid", "p1"), "Cookie", cookie); r.code != 401 || r.status != "401 Permission denied - invalid csrf token" {
			t.Fatalf("non-GET without CSRF: want 401, got %s", r.status)
		}
		// Auditor has no Pool.Allocate: CSRF passes, permission fails.
		if r := e.call("POST", "/pools", form("poolid", "p1"), "Cookie", cookie, "CSRFPreventionToken", csrf); r.code != 403 {
			t.Fatalf("with CSRF: want 403, got %s", r.status)
		}
		if r := e.call("POST", "/access/ticket", form("username", "ci@pve", "password", "nope")); r.code != 401 || r.status != "401 authentication failure" {
			t.Fatalf("bad password: want 401 authentication failure, got %s", r.status)
		}
		e.clock.Advance(90 * time.Minute)
		renewed := e.mustOK(e.call("POST", "/access/ticket", form("username", "ci@pve", "password", ticket))).dataMap(t)["ticket"].(string)
		e.clock.Advance(40 * time.Minute) // the first ticket is now 130 minutes old
		if r := e.call("GET", "/version", nil, "Cookie", cookie); r.code != 401 {
			t.Fatalf("expired ticket: want 401, got %s", r.status)
		}
		e.mustOK(e.call("GET", "/version", nil, "Cookie", "PVEAuthCookie="+renewed))
	})
}

func TestShapes(t *testing.T) {
	e := newEnv(t, nil)
	v := e.mustOK(e.call("GET", "/version", nil)).dataMap(t)
	for _, k := range []string{"version", "release", "repoid"} {
		if _, ok := v[k].(string); !ok {
			t.Errorf("version lacks %s: %v", k, v)
		}
	}
	nodes := e.mustOK(e.call("GET", "/nodes", nil)).dataList(t)
	fp := regexp.MustCompile(`^([0-9A-F]{2}:){31}[0-9A-F]{2}$`)
	if len(nodes) != 1 || nodes[0]["node"] != "pve1" || nodes[0]["status"] != "online" || nodes[0]["id"] != "node/pve1" ||
		nodes[0]["type"] != "node" || !fp.MatchString(nodes[0]["ssl_fingerprint"].(string)) || nodes[0]["maxmem"] == nil {
		t.Errorf("bad /nodes: %v", nodes)
	}
	st := e.mustOK(e.call("GET", "/nodes/pve1/status", nil)).dataMap(t)
	if la, ok := st["loadavg"].([]any); !ok || len(la) != 3 || la[0] != "0.12" {
		t.Errorf("loadavg must be 3 strings: %v", st["loadavg"])
	}
	for _, k := range []string{"cpuinfo", "memory", "swap", "rootfs", "uptime", "kversion", "pveversion"} {
		if st[k] == nil {
			t.Errorf("node status lacks %s", k)
		}
	}
	if id := e.mustOK(e.call("GET", "/cluster/nextid", nil)).data(); id != "100" {
		t.Errorf("nextid: want string \"100\", got %#v", id)
	}
	if id := e.mustOK(e.call("GET", "/cluster/nextid", nil)).data(); id != "100" {
		t.Errorf("nextid must reserve nothing, got %#v", id)
	}
	if id := e.mustOK(e.call("GET", "/cluster/nextid", form("vmid", "4242"))).data(); id != "4242" {
		t.Errorf("nextid?vmid=4242: got %#v", id)
	}
	ss := e.mustOK(e.call("GET", "/nodes/pve1/storage/local/status", nil)).dataMap(t)
	if ss["type"] != "dir" || ss["content"] != "backup,import,iso,snippets,vztmpl" || ss["active"] != float64(1) || ss["shared"] != float64(0) || ss["total"] == nil {
		t.Errorf("bad storage status: %v", ss)
	}
	for _, typ := range []string{"vm", "storage", "node", "sdn"} {
		for _, r := range e.mustOK(e.call("GET", "/cluster/resources", form("type", typ))).dataList(t) {
			want := map[string]string{"vm": "qemu", "storage": "storage", "node": "node"}[typ]
			if r["type"] != want {
				t.Errorf("type=%s returned %v", typ, r)
			}
		}
	}
}

// TestCloneLifecycle follows a clone through placeholder, lock, completion,
// configuration, start, agent, stop and destroy on the fake clock.
func TestCloneLifecycle(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Latency = Latency{ClonePlaceholder: Duration(time.Second), CloneBase: Duration(5 * time.Second),
			Start: Duration(time.Second), Boot: Duration(20 * time.Second), Destroy: Duration(time.Second)}
		c.RefreshInterval = Duration(10 * time.Second)
	})
	upid := e.clone("101", form("name", "ci-1"))
	if !regexp.MustCompile(`^UPID:pve1:[0-9A-F]{8}:[0-9A-F]{8,9}:[0-9A-F]{8}:qmclone:9000:root@pam!sim:$`).MatchString(upid) {
		t.Fatalf("UPID %q: want qmclone, source id and trailing colon", upid)
	}
	st := e.task(upid)
	if st["status"] != "running" || st["exitstatus"] != nil || st["type"] != "qmclone" || st["id"] != "9000" ||
		st["user"] != "root@pam" || st["tokenid"] != "sim" || st["upid"] != upid {
		t.Fatalf("running task status: %v", st)
	}
	if r := e.call("GET", "/nodes/pve1/qemu/101/config", nil); r.code != 500 || !strings.Contains(r.status, "101.conf' does not exist") {
		t.Fatalf("before the placeholder: want 500 does not exist, got %s", r.status)
	}
	e.clock.Advance(time.Second)
	if c := e.mustOK(e.call("GET", "/nodes/pve1/qemu/101/config", nil)).dataMap(t); c["lock"] != "clone" || len(c) != 2 {
		t.Fatalf("placeholder config: %v", c)
	}
	if r := e.call("POST", "/nodes/pve1/qemu/101/config", form("cores", "4")); r.status != "500 VM is locked (clone)" {
		t.Fatalf("config while cloning: got %s", r.status)
	}
	res := findVM(t, e, 101)
	if res["lock"] != "clone" || res["status"] != "unknown" || res["name"] != nil {
		t.Fatalf("resources during clone: %v", res)
	}
	e.clock.Advance(5 * time.Second)
	e.wantExit(upid, "OK")
	conf := e.mustOK(e.call("GET", "/nodes/pve1/qemu/101/config", nil)).dataMap(t)
	tmpl := e.mustOK(e.call("GET", "/nodes/pve1/qemu/9000/config", nil)).dataMap(t)
	if conf["lock"] != nil || conf["template"] != nil || conf["name"] != "ci-1" || conf["tags"] != "template" || conf["cores"] != float64(2) {
		t.Fatalf("clone config: %v", conf)
	}
	if conf["net0"] == tmpl["net0"] || conf["smbios1"] == tmpl["smbios1"] || conf["vmgenid"] == tmpl["vmgenid"] {
		t.Fatalf("clone must get new MAC, SMBIOS uuid and vmgenid: %v vs %v", conf, tmpl)
	}
	if !strings.HasPrefix(conf["scsi0"].(string), "local-lvm:vm-101-disk-0,") || conf["ide2"] != "local-lvm:vm-101-cloudinit,media=cdrom" {
		t.Fatalf("clone disks: %v / %v", conf["scsi0"], conf["ide2"])
	}
	// Lock and tags are live in /cluster/resources, status is sampled.
	e.mustOK(e.call("PUT", "/nodes/pve1/qemu/101/config", form("tags", "Zeta,alpha;beta alpha HF")))
	if res := findVM(t, e, 101); res["tags"] != "alpha;beta;hf;zeta" || res["status"] != "unknown" {
		t.Fatalf("live tags / sampled status: %v", res)
	}
	e.clock.Advance(4 * time.Second) // first refresh at t0+10s
	if res := findVM(t, e, 101); res["status"] != "stopped" || res["name"] != "ci-1" || res["template"] != float64(0) {
		t.Fatalf("after refresh: %v", res)
	}
	// Agent errors in order: not running, booting, ready.
	agent := "/nodes/pve1/qemu/101/agent/network-get-interfaces"
	if r := e.call("GET", agent, nil); r.status != "500 VM 101 is not running" {
		t.Fatalf("agent on stopped VM: %s", r.status)
	}
	memBefore := nodeMemUsed(t, e)
	start := e.upid(e.call("POST", "/nodes/pve1/qemu/101/status/start", nil))
	e.clock.Advance(time.Second)
	e.wantExit(start, "OK")
	if got := nodeMemUsed(t, e) - memBefore; got != 2048<<20 {
		t.Fatalf("node memory must grow by the VM's 2 GiB, grew by %d", got)
	}
	if cur := e.mustOK(e.call("GET", "/nodes/pve1/qemu/101/status/current", nil)).dataMap(t); cur["status"] != "running" || cur["agent"] != float64(1) || cur["pid"] == nil {
		t.Fatalf("status/current: %v", cur)
	}
	if res := findVM(t, e, 101); res["status"] != "stopped" {
		t.Fatalf("resources status must lag until the next sample: %v", res)
	}
	if r := e.call("GET", agent, nil); r.status != "500 QEMU guest agent is not running" {
		t.Fatalf("agent while booting: %s", r.status)
	}
	if r := e.call("DELETE", "/nodes/pve1/qemu/101", nil); r.status != "500 VM 101 is running - destroy failed" {
		t.Fatalf("destroy running VM: %s", r.status)
	}
	e.clock.Advance(20 * time.Second)
	ifaces := e.mustOK(e.call("GET", agent, nil)).dataMap(t)["result"].([]any)
	eth0 := ifaces[1].(map[string]any)
	if eth0["name"] != "eth0" || eth0["ip-addresses"].([]any)[0].(map[string]any)["ip-address"] != "10.99.0.10" ||
		!strings.EqualFold(eth0["hardware-address"].(string), macOf(conf["net0"].(string))) {
		t.Fatalf("agent interfaces: %v", ifaces)
	}
	if res := findVM(t, e, 101); res["status"] != "running" {
		t.Fatalf("resources after refresh: %v", res)
	}
	stop := e.upid(e.call("POST", "/nodes/pve1/qemu/101/status/stop", nil))
	e.wantExit(stop, "OK")
	if got := nodeMemUsed(t, e); got != memBefore {
		t.Fatalf("node memory after stop: want %d, got %d", memBefore, got)
	}
	e.mustOK(e.call("PUT", "/nodes/pve1/qemu/101/config", form("protection", "1")))
	if r := e.call("DELETE", "/nodes/pve1/qemu/101", nil); r.status != "500 can't remove VM 101 - protection mode enabled" {
		t.Fatalf("destroy protected VM: %s", r.status)
	}
	e.mustOK(e.call("PUT", "/nodes/pve1/qemu/101/config", form("delete", "protection")))
	del := e.upid(e.call("DELETE", "/nodes/pve1/qemu/101", form("purge", "1")))
	if c := e.mustOK(e.call("GET", "/nodes/pve1/qemu/101/config", nil)).dataMap(t); c["lock"] != "destroyed" {
		t.Fatalf("destroy stub: %v", c)
	}
	e.clock.Advance(time.Second)
	e.wantExit(del, "OK")
	if r := e.call("GET", "/nodes/pve1/qemu/101/config", nil); r.code != 500 {
		t.Fatalf("after destroy: %s", r.status)
	}
	for _, s := range e.sim.State().Storages {
		for _, v := range s.Volumes {
			if v.VMID == 101 {
				t.Fatalf("volume %s of destroyed VM left behind", v.VolID)
			}
		}
	}
}

func findVM(t *testing.T, e *simEnv, vmid int) map[string]any {
	t.Helper()
	for _, r := range e.mustOK(e.call("GET", "/cluster/resources", form("type", "vm"))).dataList(t) {
		if r["vmid"] == float64(vmid) {
			return r
		}
	}
	t.Fatalf("VM %d not in /cluster/resources", vmid)
	return nil
}

func nodeMemUsed(t *testing.T, e *simEnv) int64 {
	t.Helper()
	st := e.mustOK(e.call("GET", "/nodes/pve1/status", nil)).dataMap(t)
	return int64(st["memory"].(map[string]any)["used"].(float64))
}

func TestTaskOutcomes(t *testing.T) {
	e := newEnv(t, nil)
	t.Run("starting a template fails inside the task", func(t *testing.T) {
		e.t = t
		e.wantExit(e.upid(e.call("POST", "/nodes/pve1/qemu/9000/status/start", nil)), "you can't start a vm if it's a template")
	})
	t.Run("async config returns a qmconfig UPID, sync returns null", func(t *testing.T) {
		e.t = t
		e.wantExit(e.clone("102", nil), "OK")
		u := e.upid(e.call("POST", "/nodes/pve1/qemu/102/config", form("cores", "4", "ipconfig0", "ip=10.0.0.5/24,gw=10.0.0.1")))
		if !strings.Contains(u, ":qmconfig:102:") {
			t.Fatalf("config UPID %s", u)
		}
		e.wantExit(u, "OK")
		if r := e.mustOK(e.call("PUT", "/nodes/pve1/qemu/102/config", form("memory", "4096"))); r.data() != nil || string(r.raw) != `{"data":null}` {
			t.Fatalf("sync config must return null: %s", r.raw)
		}
		c := e.mustOK(e.call("GET", "/nodes/pve1/qemu/102/config", nil)).dataMap(t)
		if c["cores"] != float64(4) || c["memory"] != "4096" || c["ipconfig0"] != "ip=10.0.0.5/24,gw=10.0.0.1" {
			t.Fatalf("config not applied: %v", c)
		}
		if r := e.call("PUT", "/nodes/pve1/qemu/102/config", form("cores", "2", "digest", "0000")); r.status != "500 detected modified configuration - file changed by other user? Try again." {
			t.Fatalf("digest mismatch: %s", r.status)
		}
		e.mustOK(e.call("PUT", "/nodes/pve1/qemu/102/config", form("cores", "2", "digest", c["digest"].(string))))
		e.mustOK(e.call("PUT", "/nodes/pve1/qemu/102/config", form("delete", "ipconfig0")))
		if c := e.mustOK(e.call("GET", "/nodes/pve1/qemu/102/config", nil)).dataMap(t); c["ipconfig0"] != nil {
			t.Fatalf("delete ignored: %v", c)
		}
		if r := e.call("PUT", "/nodes/pve1/qemu/102/config", form("cores", "2", "delete", "cores")); r.code != 400 {
			t.Fatalf("set and delete the same key: %s", r.status)
		}
	})
	t.Run("resize grows and refuses to shrink", func(t *testing.T) {
		e.t = t
		e.wantExit(e.upid(e.call("PUT", "/nodes/pve1/qemu/102/resize", form("disk", "scsi0", "size", "+10G"))), "OK")
		if c := e.mustOK(e.call("GET", "/nodes/pve1/qemu/102/config", nil)).dataMap(t); !strings.Contains(c["scsi0"].(string), "size=42G") {
			t.Fatalf("resize not applied: %v", c["scsi0"])
		}
		e.wantExit(e.upid(e.call("PUT", "/nodes/pve1/qemu/102/resize", form("disk", "scsi0", "size", "8G"))), "shrinking disks is not supported")
	})
	t.Run("nextid skips existing VMs but reserves nothing", func(t *testing.T) {
		e.t = t
		e.wantExit(e.clone("100", nil), "OK")
		if id := e.mustOK(e.call("GET", "/cluster/nextid", nil)).data(); id != "101" {
			t.Fatalf("nextid: %v", id)
		}
	})
	t.Run("concurrent clones to one id: the loser fails inside the task", func(t *testing.T) {
		e.t = t
		e.sim.SetLatency(Latency{ClonePlaceholder: Duration(time.Second)})
		defer e.sim.SetLatency(Latency{})
		a, b := e.clone("300", nil), e.clone("300", nil)
		e.clock.Advance(time.Second)
		e.wantExit(a, "OK")
		e.wantExit(b, "unable to create VM 300: config file already exists")
	})
}

func TestLinkedCloneSupport(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Storages = append(c.Storages,
			StorageConfig{ID: "thick", Type: "lvm", Content: []string{"images"}},
			StorageConfig{ID: "nfs1", Type: "nfs", Content: []string{"images", "iso"}, Shared: true})
		c.Templates = append(c.Templates,
			TemplateConfig{VMID: 9001, Node: "pve1", Name: "thick", Storage: "thick"},
			TemplateConfig{VMID: 9002, Node: "pve1", Name: "qcow", Storage: "nfs1"})
	})
	if r := e.call("POST", "/nodes/pve1/qemu/9001/clone", form("newid", "110")); r.status != "500 Linked clone feature is not supported for 'thick:base-9001-disk-0' (scsi0)" {
		t.Fatalf("linked clone on thick LVM: %s", r.status)
	}
	e.wantExit(e.upid(e.call("POST", "/nodes/pve1/qemu/9001/clone", form("newid", "110", "full", "1"))), "OK")
	e.wantExit(e.upid(e.call("POST", "/nodes/pve1/qemu/9002/clone", form("newid", "111"))), "OK")
	c := e.mustOK(e.call("GET", "/nodes/pve1/qemu/111/config", nil)).dataMap(t)
	if !strings.HasPrefix(c["scsi0"].(string), "nfs1:9002/base-9002-disk-0.qcow2/111/vm-111-disk-0.qcow2,") {
		t.Fatalf("linked qcow2 clone volume: %v", c["scsi0"])
	}
	if r := e.call("POST", "/nodes/pve1/qemu/110/clone", form("newid", "112", "full", "0")); r.status != "500 Linked clone feature is not supported for 'thick:vm-110-disk-0' (scsi0)" {
		t.Fatalf("linked clone of a non-template: %s", r.status)
	}
}

// TestStorageLockQueue: clones of one template on one storage queue on the
// storage lock and the one that would wait too long fails with got timeout.
func TestStorageLockQueue(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Latency = Latency{CloneBase: Duration(6 * time.Second)}
		c.StorageLockTimeout = Duration(10 * time.Second)
	})
	u1, u2, u3 := e.clone("201", nil), e.clone("202", nil), e.clone("203", nil)
	e.clock.Advance(6 * time.Second)
	e.wantExit(u1, "OK")
	if st := e.task(u2)["status"]; st != "running" {
		t.Fatalf("second clone must still be queued/running, is %v", st)
	}
	e.clock.Advance(4 * time.Second)
	e.wantExit(u3, "clone failed: can't lock file '/var/lock/pve-manager/pve-storage-local-lvm' - got timeout")
	e.clock.Advance(2 * time.Second)
	e.wantExit(u2, "OK")
	if r := e.call("GET", "/nodes/pve1/qemu/203/config", nil); r.code != 500 {
		t.Fatalf("failed clone must remove its placeholder: %s", r.status)
	}
}

func TestUploadAndContent(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Storages = append(c.Storages, StorageConfig{ID: "tmpl", Type: "dir", Content: []string{"vztmpl"}})
	})
	r := e.upload("pve1", "local", "iso", "../My Seed!.iso", []byte("iso-bytes"), nil)
	u := e.upid(r)
	if !strings.Contains(u, ":imgcopy::root@pam!sim:") {
		t.Fatalf("upload UPID %s: want imgcopy with empty id", u)
	}
	e.wantExit(u, "OK")
	items := e.mustOK(e.call("GET", "/nodes/pve1/storage/local/content", form("content", "iso"))).dataList(t)
	if len(items) != 1 || items[0]["volid"] != "local:iso/My_Seed_.iso" || items[0]["size"] != float64(9) {
		t.Fatalf("content after upload: %v", items)
	}
	e.mustOK(e.call("GET", "/nodes/pve1/storage/local/content/local:iso/My_Seed_.iso", nil))
	for name, tc := range map[string]struct {
		storage, content, file, status string
		errs                           map[string]string
	}{
		"wrong extension":  {"local", "iso", "seed.txt", "400 Parameter verification failed.", map[string]string{"filename": "wrong file extension"}},
		"block storage":    {"local-lvm", "iso", "seed.iso", "500 can't upload to storage type 'lvmthin'", nil},
		"content missing":  {"tmpl", "iso", "seed.iso", "500 storage 'tmpl' does not support 'iso' content", nil},
		"content enum":     {"local", "images", "seed.iso", "400 Parameter verification failed.", map[string]string{"content": "value 'images' does not have a value in the enumeration 'iso, vztmpl, import'"}},
		"vztmpl extension": {"tmpl", "vztmpl", "x.iso", "400 Parameter verification failed.", map[string]string{"filename": "wrong file extension"}},
	} {
		t.Run(name, func(t *testing.T) {
			e.t = t
			r := e.upload("pve1", tc.storage, tc.content, tc.file, []byte("x"), nil)
			if r.status != tc.status {
				t.Fatalf("want %q, got %q %s", tc.status, r.status, r.raw)
			}
			for k, v := range tc.errs {
				if r.errors()[k] != v {
					t.Fatalf("errors[%s]: want %q, got %v", k, v, r.errors())
				}
			}
		})
	}
	e.t = t
	e.wantExit(e.upid(e.upload("pve1", "local", "iso", "sum.iso", []byte("abc"), map[string]string{
		"checksum-algorithm": "sha256", "checksum": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"})), "OK")
	e.wantExit(e.upid(e.upload("pve1", "local", "iso", "bad.iso", []byte("abc"), map[string]string{
		"checksum-algorithm": "sha256", "checksum": "00"})), "checksum mismatch: got 'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad' != expect '00'")
	del := e.upid(e.call("DELETE", "/nodes/pve1/storage/local/content/local:iso/My_Seed_.iso", nil))
	if !strings.Contains(del, ":imgdel::") {
		t.Fatalf("delete UPID %s", del)
	}
	e.wantExit(del, "OK")
	e.wantExit(e.upid(e.call("DELETE", "/nodes/pve1/storage/local/content/local:iso/My_Seed_.iso", nil)),
		"unlink '/var/lib/vz/template/iso/My_Seed_.iso' failed - No such file or directory")
}

func TestPools(t *testing.T) {
	e := newEnv(t, nil)
	e.mustOK(e.call("POST", "/pools", form("poolid", "ci", "comment", "runners")))
	if r := e.call("POST", "/pools", form("poolid", "ci")); r.status != "500 pool 'ci' already exists" {
		t.Fatalf("duplicate pool: %s", r.status)
	}
	if r := e.call("POST", "/nodes/pve1/qemu/9000/clone", form("newid", "120", "pool", "nope")); r.status != "500 pool 'nope' does not exist" {
		t.Fatalf("unknown pool: %s", r.status)
	}
	e.wantExit(e.clone("120", form("pool", "ci")), "OK")
	pools := e.mustOK(e.call("GET", "/pools", nil)).dataList(t)
	if len(pools) != 1 || pools[0]["poolid"] != "ci" || pools[0]["comment"] != "runners" {
		t.Fatalf("pools: %v", pools)
	}
	if res := findVM(t, e, 120); res["pool"] != "ci" {
		t.Fatalf("pool in resources: %v", res)
	}
}

func TestFaultInjection(t *testing.T) {
	e := newEnv(t, nil)
	if err := e.sim.SetFaults(Faults{Classes: map[string]FaultSpec{"clone": {ErrorRate: 1}}}); err != nil {
		t.Fatal(err)
	}
	r := e.call("POST", "/nodes/pve1/qemu/9000/clone", form("newid", "130"))
	if r.code != 500 || (r.status != "500 can't lock file '/var/lock/qemu-server/lock-9000.conf' - got timeout" && r.status != "500 VM is locked (clone)") {
		t.Fatalf("injected clone error: %s", r.status)
	}
	e.mustOK(e.call("GET", "/version", nil))
	if err := e.sim.SetFaults(Faults{Classes: map[string]FaultSpec{"*": {DropRate: 1}}}); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", e.srv.URL+"/api2/json/version", nil)
	req.Header.Set("Authorization", rootToken)
	if res, err := e.srv.Client().Do(req); err == nil {
		res.Body.Close()
		t.Fatalf("dropped connection must fail the request, got %s", res.Status)
	}
	if err := e.sim.SetFaults(Faults{OfflineNodes: []string{"pve1"}}); err != nil {
		t.Fatal(err)
	}
	if r := e.call("GET", "/nodes/pve1/qemu/9000/status/current", nil); r.code != 595 {
		t.Fatalf("offline node: want 595, got %s", r.status)
	}
	if n := e.mustOK(e.call("GET", "/nodes", nil)).dataList(t)[0]; n["status"] != "offline" {
		t.Fatalf("offline node in /nodes: %v", n)
	}
	if err := e.sim.SetFaults(Faults{Classes: map[string]FaultSpec{"bogus": {}}}); err == nil {
		t.Fatal("unknown class must be rejected")
	}
}

func TestAdminAPI(t *testing.T) {
	e := newEnv(t, nil, WithAdmin(true))
	e.mustOK(e.call("PUT", "/nodes/pve1/qemu/9000/config", form("description", "token: s3cr3t-value")))
	e.wantExit(e.upid(e.upload("pve1", "local", "iso", "x.iso", []byte("hunter2-inside"), nil)), "OK")
	for _, tc := range []struct{ method, path, body, want string }{
		{"GET", "/_sim/state", "", "s3cr3t-value"},
		{"PUT", "/_sim/latency", `{"cloneBase":"2s"}`, `"cloneBase": "2s"`},
		{"PUT", "/_sim/faults", `{"classes":{"agent":{"errorRate":0.5}}}`, `"errorRate": 0.5`},
		{"POST", "/_sim/clock/advance?by=3s", "", "2026-01-02T03:04:08Z"},
		{"POST", "/_sim/nodes/pve1/offline", "", `"online": false`},
	} {
		req, _ := http.NewRequest(tc.method, e.srv.URL+tc.path, strings.NewReader(tc.body))
		res, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw := readAll(t, res)
		if res.StatusCode != 200 || !strings.Contains(raw, tc.want) {
			t.Fatalf("%s %s: %s %s", tc.method, tc.path, res.Status, raw)
		}
	}
	st := e.sim.State()
	found := false
	for _, s := range st.Storages {
		for _, v := range s.Volumes {
			found = found || strings.Contains(string(v.Data), "hunter2")
		}
	}
	if !found {
		t.Fatal("state dump must include uploaded file contents")
	}
	// Off unless asked for.
	for name, opts := range map[string][]Option{"by default": nil, "disabled": {WithAdmin(false)}} {
		off, err := New(testConfig(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		req := httptestRequest("GET", "/_sim/state")
		req.RemoteAddr = "127.0.0.1:40000"
		rec := newRecorder()
		off.ServeHTTP(rec, req)
		_ = off.Close()
		if rec.Code != 404 {
			t.Errorf("admin API %s: got %d, want it off (404)", name, rec.Code)
		}
	}
	// Enabled, it answers loopback clients only.
	for _, peer := range []string{"192.0.2.1:1234", "[2001:db8::1]:1234", "10.0.0.5:80"} {
		req := httptestRequest("GET", "/_sim/state")
		req.RemoteAddr = peer
		rec := newRecorder()
		e.sim.ServeHTTP(rec, req)
		if rec.Code != http.StatusForbidden || strings.Contains(rec.Body.String(), "s3cr3t-value") {
			t.Errorf("admin API for peer %s: %d %q, want 403 without the state", peer, rec.Code, rec.Body.String())
		}
	}
	req := httptestRequest("GET", "/_sim/state")
	req.RemoteAddr = "[::1]:40000"
	rec := newRecorder()
	e.sim.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Errorf("admin API for an IPv6 loopback peer: %d", rec.Code)
	}
}

// TestLatencyOnSimClock shows that latency spikes and per-request API latency
// hold a request until the simulator's clock reaches its due time.
func TestLatencyOnSimClock(t *testing.T) {
	for name, setup := range map[string]func(*simEnv){
		"spike": func(e *simEnv) {
			if err := e.sim.SetFaults(Faults{Classes: map[string]FaultSpec{"*": {SpikeRate: 1, SpikeLatency: Duration(5 * time.Second)}}}); err != nil {
				t.Fatal(err)
			}
		},
		"api latency": func(e *simEnv) { e.sim.SetLatency(Latency{API: Duration(5 * time.Second)}) },
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, nil)
			e.t = t
			setup(e)
			before := e.clock.Pending()
			got := make(chan apiResp, 1)
			go func() {
				req, _ := http.NewRequest("GET", e.srv.URL+"/api2/json/version", nil)
				req.Header.Set("Authorization", rootToken)
				got <- e.send(req)
			}()
			deadline := time.Now().Add(10 * time.Second)
			for e.clock.Pending() == before {
				if time.Now().After(deadline) {
					t.Fatal("request never parked on the simulator clock")
				}
				time.Sleep(time.Millisecond)
			}
			e.clock.Advance(4 * time.Second)
			if e.clock.Pending() == before {
				t.Fatal("the 5s delay fired after 4s of simulator time")
			}
			select {
			case r := <-got:
				t.Fatalf("answered after 4s of a 5s delay: %s", r.status)
			default:
			}
			e.clock.Advance(time.Second)
			select {
			case r := <-got:
				e.mustOK(r)
			case <-time.After(10 * time.Second):
				t.Fatal("no answer once the delay elapsed on the simulator clock")
			}
		})
	}
}

// TestClusterStatusOfStandaloneNode: a node outside any cluster lists only
// itself in /cluster/status; a cluster lists its name first.
func TestClusterStatusOfStandaloneNode(t *testing.T) {
	for _, name := range []string{"", "lab"} {
		e := newEnv(t, func(c *Config) { c.ClusterName = name })
		entries := e.mustOK(e.call("GET", "/cluster/status", nil)).dataList(t)
		var clusters []string
		for _, en := range entries {
			if en["type"] == "cluster" {
				clusters = append(clusters, en["name"].(string))
			}
		}
		want := 1
		if name == "" {
			want = 0
		}
		if len(clusters) != want || (want == 1 && clusters[0] != name) || entries[len(entries)-1]["type"] != "node" {
			t.Errorf("clusterName %q: /cluster/status = %v", name, entries)
		}
	}
}

// TestTaskFailureFault: with TaskFailRate 1 a request still gets its UPID,
// and its task ends with a worker's error having done nothing: no clone,
// the VM still there after a failed destroy, still stopped after a failed
// start; every injected fault is counted by kind and class.
func TestTaskFailureFault(t *testing.T) {
	e := newEnv(t, nil)
	if err := e.sim.SetFaults(Faults{Classes: map[string]FaultSpec{"*": {TaskFailRate: 1}}}); err != nil {
		t.Fatal(err)
	}
	upid := e.clone("131", nil)
	if st := e.task(upid); st["status"] != "stopped" || !strings.HasPrefix(fmt.Sprint(st["exitstatus"]), "clone failed: ") {
		t.Fatalf("clone task under TaskFailRate 1: %v", st)
	}
	if r := e.call("GET", "/nodes/pve1/qemu/131/config", nil); r.code != 500 {
		t.Fatalf("the failed clone left VM 131: %s", r.raw)
	}
	if err := e.sim.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	e.wantExit(e.clone("132", nil), "OK")
	if err := e.sim.SetFaults(Faults{Classes: map[string]FaultSpec{"power": {TaskFailRate: 1}, "destroy": {TaskFailRate: 1}}}); err != nil {
		t.Fatal(err)
	}
	upid = e.upid(e.call("POST", "/nodes/pve1/qemu/132/status/start", nil))
	if st := e.task(upid); st["exitstatus"] == "OK" {
		t.Fatalf("start task under TaskFailRate 1: %v", st)
	}
	if st := e.mustOK(e.call("GET", "/nodes/pve1/qemu/132/status/current", nil)).dataMap(t); st["status"] != "stopped" {
		t.Fatalf("VM 132 after a failed start: %v", st["status"])
	}
	upid = e.upid(e.call("DELETE", "/nodes/pve1/qemu/132", nil))
	if st := e.task(upid); st["exitstatus"] == "OK" {
		t.Fatalf("destroy task under TaskFailRate 1: %v", st)
	}
	if cfg := e.mustOK(e.call("GET", "/nodes/pve1/qemu/132/config", nil)).dataMap(t); cfg["lock"] != nil {
		t.Fatalf("VM 132 after a failed destroy keeps lock %v; want none", cfg["lock"])
	}
	if err := e.sim.SetFaults(Faults{Classes: map[string]FaultSpec{"config": {ErrorRate: 1}}}); err != nil {
		t.Fatal(err)
	}
	if r := e.call("PUT", "/nodes/pve1/qemu/132/config", form("description", "x")); r.code != 500 {
		t.Fatalf("config under ErrorRate 1: %s", r.status)
	}
	if err := e.sim.SetFaults(Faults{OfflineNodes: []string{"pve1"}}); err != nil {
		t.Fatal(err)
	}
	if r := e.call("GET", "/nodes/pve1/qemu/132/status/current", nil); r.code != 595 {
		t.Fatalf("offline node: %s", r.status)
	}
	got := e.sim.InjectedFaults()
	want := map[string]map[string]int{
		FaultTaskFailure: {"clone": 1, "power": 1, "destroy": 1},
		FaultError:       {"config": 1},
		FaultOffline:     {"node": 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("InjectedFaults() = %v; want %v", got, want)
	}
}
