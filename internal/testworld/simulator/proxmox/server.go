package proxmoxsim

import (
	"bufio"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox/privileges"
)

// apiPrefix is where pveproxy serves the JSON API.
const apiPrefix = "/api2/json"

// Simulator is an in-memory Proxmox VE cluster that speaks the REST API of
// pveproxy (what it models is listed in its README.md; the error answers
// are pinned by conformance_test.go). It is an http.Handler: serve it
// with httptest.NewServer or any http.Server with HTTP/2 disabled (pveproxy
// speaks HTTP/1.1 only, and error reasons travel in the status line).
//
// All state sits behind one mutex; every request and every clock event
// takes it, which keeps the model simple and race free.
type Simulator struct {
	clock  Clock
	admin  bool
	log    *slog.Logger
	secret []byte
	routes []*route

	// guest is the guest hook runner; nil when no hook is configured.
	guest *guestRunner
	// real runs the QEMU processes of real guests; nil until the first
	// one starts. Guarded by mu.
	real *realGuests

	mu         sync.Mutex
	cfg        Config
	closed     bool
	nodes      map[string]*node
	nodeOrder  []string
	storages   map[string]*storage
	storeOrder []string
	vms        map[int]*vm
	tasks      map[string]*task
	taskOrder  []string
	pools      map[string]*pool
	users      map[string]*user
	// roles are the custom roles pveum created, by name, each its
	// privileges.
	roles map[string][]string
	rng   *mrand.Rand
	// injected counts injected faults by kind and endpoint class
	// (InjectedFaults).
	injected    map[string]map[string]int
	events      eventQueue
	eventSeq    uint64
	timer       Timer
	timerAt     time.Time
	sample      *resourceSample
	storageBusy map[string]time.Time
	lastPID     int
	addrs       *addressPool
	// fw is the firewall configuration (firewall.go), nil until used;
	// fwApplied what firewall_enforce.go last loaded.
	fw        *fwState
	fwApplied string
	fwErr     error
	// pciMaps are the PCI resource mappings by id (mapping.go).
	pciMaps map[string]PCIMapping
	// callLog receives every checked call (WithCallLog); nil: none.
	callLog func(CallRecord)
}

// Option customises a Simulator built by New.
type Option func(*Simulator)

// WithClock makes the simulator schedule all work on c (e.g. a FakeClock).
func WithClock(c Clock) Option { return func(s *Simulator) { s.clock = c } }

// WithAdmin enables the /_sim/ admin API (off unless asked for, in the Go
// API as in the standalone binary). It answers loopback clients only: it
// rewrites the cluster's state, faults and clock, and dumps its secrets.
func WithAdmin(enabled bool) Option { return func(s *Simulator) { s.admin = enabled } }

// WithLogger sets the logger for guest hook and scheduling diagnostics.
func WithLogger(l *slog.Logger) Option { return func(s *Simulator) { s.log = l } }

// New builds a simulator from cfg. Call Close to stop guest processes and
// timers.
func New(cfg Config, opts ...Option) (*Simulator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid simulator config: %w", err)
	}
	s := &Simulator{
		clock:       RealClock{},
		log:         slog.New(slog.NewTextHandler(io.Discard, nil)),
		cfg:         cfg,
		nodes:       map[string]*node{},
		storages:    map[string]*storage{},
		vms:         map[int]*vm{},
		tasks:       map[string]*task{},
		pools:       map[string]*pool{},
		users:       map[string]*user{},
		storageBusy: map[string]time.Time{},
		rng:         mrand.New(mrand.NewSource(cfg.Seed)),
		lastPID:     4000,
	}
	for _, o := range opts {
		o(s)
	}
	s.secret = make([]byte, 32)
	if _, err := rand.Read(s.secret); err != nil {
		return nil, fmt.Errorf("generate ticket key: %w", err)
	}
	var err error
	if s.addrs, err = newAddressPool(cfg.Guest.AddressRange, cfg.Guest.Prefix); err != nil {
		return nil, fmt.Errorf("guest address range: %w", err)
	}
	s.routes = apiRoutes()
	if err := bindPrivileges(s.routes); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	s.initNodes(now)
	for _, n := range cfg.Faults.OfflineNodes {
		if s.nodes[n] == nil {
			return nil, fmt.Errorf("faults.offlineNodes: unknown node %q", n)
		}
		s.nodes[n].online = false
	}
	s.initStorages()
	s.initUsers()
	for _, p := range cfg.Pools {
		s.pools[p.ID] = &pool{id: p.ID, comment: p.Comment, members: map[int]bool{}}
	}
	if err := s.initTemplates(); err != nil {
		return nil, err
	}
	s.takeSampleLocked(now)
	s.scheduleRefreshLocked()
	// The guest runner starts a listener, so create it last: nothing can
	// fail after it.
	if cfg.Guest.Command != nil {
		if s.guest, err = newGuestRunner(s, cfg.Guest); err != nil {
			return nil, fmt.Errorf("guest hook: %w", err)
		}
	}
	return s, nil
}

// Close kills guest processes, stops timers and makes further requests fail
// with 503. It is safe to call more than once.
func (s *Simulator) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	if s.timer != nil {
		s.timer.Stop()
	}
	realGuests := s.real
	fwErr := s.removeFirewallLocked()
	s.mu.Unlock()
	errs := []error{fwErr}
	if realGuests != nil {
		errs = append(errs, realGuests.close())
	}
	if s.guest != nil {
		errs = append(errs, s.guest.close())
	}
	return errors.Join(errs...)
}

// apiError is an error with the HTTP status pveproxy would send.
type apiError struct {
	code int
	// msg is the message; pveproxy puts it (without the final newline) in
	// the status line and (with it) in the JSON "message".
	msg    string
	errors map[string]string
}

func (e *apiError) Error() string { return strings.TrimSuffix(e.msg, "\n") }

// paramError is a 400 "Parameter verification failed." with per-parameter
// messages.
func paramError(errs map[string]string) *apiError {
	return &apiError{code: http.StatusBadRequest, msg: "Parameter verification failed.\n", errors: errs}
}

// serverError is a handler failure (HTTP 500), the way `die "...\n"` in a
// Proxmox API handler surfaces.
func serverError(format string, args ...any) *apiError {
	msg := fmt.Sprintf(format, args...)
	if !strings.HasSuffix(msg, "\n") {
		msg += "\n"
	}
	return &apiError{code: http.StatusInternalServerError, msg: msg}
}

// apiRequest is one parsed API call.
type apiRequest struct {
	r      *http.Request
	method string
	path   string // relative to /api2/json
	vars   map[string]string
	params map[string]string
	file   *uploadedFile
	auth   *identity
	route  *route
	// needs and filters are the privilege checks run for the call (the
	// call log's record).
	needs, filters []privileges.Need
}

// str returns a parameter or "".
func (q *apiRequest) str(name string) string { return q.params[name] }

// has reports whether a parameter was sent.
func (q *apiRequest) has(name string) bool { _, ok := q.params[name]; return ok }

// integer returns a validated integer parameter or def.
func (q *apiRequest) integer(name string, def int64) int64 {
	v, ok := q.params[name]
	if !ok {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return def
	}
	return n
}

// boolean returns a validated boolean parameter ("0"/"1") or def.
func (q *apiRequest) boolean(name string, def bool) bool {
	v, ok := q.params[name]
	if !ok {
		return def
	}
	return v == "1"
}

// ServeHTTP implements http.Handler.
func (s *Simulator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, adminPrefix) {
		s.serveAdmin(w, r)
		return
	}
	if !strings.HasPrefix(r.URL.Path, apiPrefix+"/") {
		http.NotFound(w, r)
		return
	}
	rel := strings.TrimPrefix(r.URL.Path, apiPrefix)
	rt, vars, ok := s.match(r.Method, rel)
	if !ok {
		// pveproxy looks the handler up before it even checks the ticket.
		s.writeError(w, r, &apiError{code: http.StatusNotImplemented, msg: fmt.Sprintf("Method '%s %s' not implemented\n", r.Method, rel)})
		return
	}
	if s.injectTransportFault(w, r, rt.class) {
		return
	}
	s.wait(r, s.apiLatency())
	params, file, perr := readParams(r)
	if perr != nil {
		s.writeError(w, r, perr)
		return
	}
	req := &apiRequest{r: r, method: r.Method, path: rel, vars: vars, params: params, file: file, route: rt}
	for k, v := range vars {
		req.params[k] = v
	}
	if !rt.noAuth {
		id, aerr := s.authenticate(r)
		if aerr != nil {
			s.writeUnauthorized(w, r, aerr.msg)
			return
		}
		req.auth = id
	}
	data, err := s.dispatch(req)
	if live, ok := data.(liveAnswer); ok && err == nil {
		data, err = live(r.Context())
	}
	if err != nil {
		var ae *apiError
		if !errors.As(err, &ae) {
			ae = serverError("%v", err)
		}
		if ae.code == http.StatusUnauthorized {
			s.writeUnauthorized(w, r, ae.msg)
			return
		}
		s.writeError(w, r, ae)
		return
	}
	s.writeData(w, data)
}

// dispatch runs permission checks, parameter verification and the handler,
// in pveproxy's order, under the state lock.
func (s *Simulator) dispatch(req *apiRequest) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, &apiError{code: http.StatusServiceUnavailable, msg: "simulator closed\n"}
	}
	s.runDueLocked()
	if req.auth != nil {
		if s.callLog != nil {
			defer func() {
				s.callLog(CallRecord{Method: req.method, Path: req.route.row.Path, Needs: req.needs, Filters: req.filters})
			}()
		}
		if err := s.checkPermissionsLocked(req); err != nil {
			return nil, err
		}
	}
	if errs := req.route.schema.validate(req.params); len(errs) > 0 {
		return nil, paramError(errs)
	}
	if n := req.vars["node"]; n != "" {
		if err := s.nodeReachableLocked(n); err != nil {
			return nil, err
		}
	}
	if err := s.injectErrorLocked(req); err != nil {
		return nil, err
	}
	data, err := req.route.handler(s, req)
	// Zero-latency work is due now: finish it before answering so that a
	// client never sees a zero-duration task "running".
	s.runDueLocked()
	if req.method != http.MethodGet {
		// A VM's net0, a clone or a destroy changes the ruleset as much
		// as the firewall endpoints do.
		s.firewallChangedLocked()
	}
	return data, err
}

// wait holds a request for d on the simulator's clock, so latency that models
// the hypervisor (spikes, per-request API latency) is as deterministic under
// a FakeClock as task durations are. It returns early if the client goes away.
func (s *Simulator) wait(r *http.Request, d time.Duration) {
	if d <= 0 {
		return
	}
	due := make(chan struct{})
	t := s.clock.AfterFunc(d, func() { close(due) })
	defer t.Stop()
	select {
	case <-due:
	case <-r.Context().Done():
	}
}

// sleepCtx holds a request for d of wall time: the 401 delay is pveproxy's
// defence against password guessing, felt by clients in real time.
func sleepCtx(r *http.Request, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
	}
}

// writeData sends a 200 {"data": ...} response.
func (s *Simulator) writeData(w http.ResponseWriter, data any) {
	body, err := json.Marshal(map[string]any{"data": data})
	if err != nil {
		s.writeError(w, nil, serverError("encode response: %v", err))
		return
	}
	w.Header().Set("Content-Type", "application/json;charset=UTF-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// writeUnauthorized sends pveproxy's empty-bodied 401 after the configured
// delay (pveproxy delays every 401 to slow down password guessing).
func (s *Simulator) writeUnauthorized(w http.ResponseWriter, r *http.Request, reason string) {
	s.mu.Lock()
	d := s.cfg.AuthFailureDelay.D()
	s.mu.Unlock()
	if d > 0 {
		sleepCtx(r, d)
	}
	writeStatus(w, r, http.StatusUnauthorized, strings.TrimSuffix(reason, "\n"), nil)
}

// writeError sends an error with Proxmox's body shape.
func (s *Simulator) writeError(w http.ResponseWriter, r *http.Request, e *apiError) {
	body := map[string]any{"data": nil}
	if e.msg != "" {
		body["message"] = e.msg
	}
	if len(e.errors) > 0 {
		body["errors"] = e.errors
	}
	raw, _ := json.Marshal(body)
	writeStatus(w, r, e.code, strings.TrimSuffix(e.msg, "\n"), raw)
}

// writeStatus writes a response whose status line carries reason instead
// of Go's canonical text: pveproxy puts the error message there and clients
// (go-proxmox turns 500s into errors.New(res.Status)) depend on it. net/http
// cannot set a reason phrase, so the connection is hijacked and the
// response written by hand; the connection is closed afterwards, which
// HTTP/1.1 clients handle through "Connection: close".
func writeStatus(w http.ResponseWriter, r *http.Request, code int, reason string, body []byte) {
	reason = strings.Map(func(c rune) rune {
		if c == '\r' || c == '\n' {
			return ' '
		}
		return c
	}, reason)
	if reason == "" {
		reason = http.StatusText(code)
	}
	hj, ok := w.(http.Hijacker)
	if ok && r != nil && r.ProtoMajor == 1 {
		// Drain what is left of the request so closing the socket does not
		// turn into a TCP reset that hides the response from the client.
		if r.Body != nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 64<<20))
		}
		conn, buf, err := hj.Hijack()
		if err == nil {
			defer conn.Close()
			// A client that went away has nobody to be told.
			_ = writeRawResponse(buf.Writer, code, reason, body)
			return
		}
	}
	w.Header().Set("Connection", "close")
	if body != nil {
		w.Header().Set("Content-Type", "application/json;charset=UTF-8")
	}
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// writeRawResponse writes the response on a hijacked connection. A
// bufio.Writer keeps its first error and returns it from every later call,
// so Flush reports a failed write of any line.
func writeRawResponse(bw *bufio.Writer, code int, reason string, body []byte) error {
	fmt.Fprintf(bw, "HTTP/1.1 %03d %s\r\n", code, reason)
	fmt.Fprintf(bw, "Date: %s\r\n", time.Now().UTC().Format(http.TimeFormat))
	_, _ = bw.WriteString("Server: pve-api-daemon/3.0\r\n")
	_, _ = bw.WriteString("Cache-Control: max-age=0\r\n")
	_, _ = bw.WriteString("Pragma: no-cache\r\n")
	_, _ = bw.WriteString("Connection: close\r\n")
	if body != nil {
		_, _ = bw.WriteString("Content-Type: application/json;charset=UTF-8\r\n")
	}
	fmt.Fprintf(bw, "Content-Length: %d\r\n\r\n", len(body))
	_, _ = bw.Write(body)
	return bw.Flush()
}

// route is one API endpoint.
type route struct {
	method  string
	pattern string
	segs    []string
	class   endpointClass
	noAuth  bool
	schema  *schema
	// row is the route's row of the privilege table.
	row     *privileges.Endpoint
	handler func(s *Simulator, q *apiRequest) (any, error)
}

// match finds the route for method and rel. A final "{name...}" segment
// swallows the rest of the path, because go-proxmox sends volume ids such as
// local:iso/x.iso unescaped.
func (s *Simulator) match(method, rel string) (*route, map[string]string, bool) {
	parts := strings.Split(strings.Trim(rel, "/"), "/")
	for _, rt := range s.routes {
		if rt.method != method {
			continue
		}
		if vars, ok := matchSegs(rt.segs, parts); ok {
			return rt, vars, true
		}
	}
	return nil, nil, false
}

func matchSegs(segs, parts []string) (map[string]string, bool) {
	vars := map[string]string{}
	for i, sg := range segs {
		if strings.HasSuffix(sg, "...}") {
			if i >= len(parts) {
				return nil, false
			}
			vars[sg[1:len(sg)-4]] = strings.Join(parts[i:], "/")
			return vars, true
		}
		if i >= len(parts) {
			return nil, false
		}
		if strings.HasPrefix(sg, "{") {
			if parts[i] == "" {
				return nil, false
			}
			vars[sg[1:len(sg)-1]] = parts[i]
			continue
		}
		if sg != parts[i] {
			return nil, false
		}
	}
	return vars, len(segs) == len(parts)
}

func newRoute(method, pattern string, class endpointClass, sch *schema, h func(*Simulator, *apiRequest) (any, error)) *route {
	return &route{
		method: method, pattern: pattern, segs: strings.Split(strings.Trim(pattern, "/"), "/"),
		class: class, schema: sch, handler: h,
	}
}

// bindPrivileges gives every route its row of the privilege table
// (pkg/provider/proxmox/privileges), the one place the simulator's
// permission checks come from; a route without a row is a table to extend.
func bindPrivileges(routes []*route) error {
	for _, rt := range routes {
		row, ok := privileges.Lookup(rt.method, tablePath(rt.pattern))
		if !ok {
			return fmt.Errorf("route %s %s has no row in the privilege table (pkg/provider/proxmox/privileges)", rt.method, rt.pattern)
		}
		rt.row = row
	}
	return nil
}

// apiRoutes is the routing table. Each schema lists every parameter the
// real endpoint accepts that the simulator honours; anything else is the
// real "property is not defined in schema" 400. The privileges each route
// checks are its row of the privilege table (bindPrivileges).
func apiRoutes() []*route {
	ticket := newRoute(http.MethodPost, "/access/ticket", classAuth, ticketSchema, (*Simulator).handleTicket)
	ticket.noAuth = true
	poolType := param{name: "type", kind: kString, optional: true, enum: []string{"qemu", "lxc", "storage"}}
	return append([]*route{
		ticket,
		newRoute(http.MethodGet, "/version", classOther, sch(), (*Simulator).handleVersion),
		newRoute(http.MethodGet, "/nodes", classOther, sch(), (*Simulator).handleNodes),
		newRoute(http.MethodGet, "/nodes/{node}/status", classStatus, sch(nodeP), (*Simulator).handleNodeStatus),
		newRoute(http.MethodGet, "/cluster/status", classOther, sch(), (*Simulator).handleClusterStatus),
		newRoute(http.MethodGet, "/cluster/resources", classResources, resourcesSchema, (*Simulator).handleResources),
		newRoute(http.MethodGet, "/cluster/mapping/pci", classOther, sch(param{name: "check-node", kind: kString, optional: true}), (*Simulator).handleMappingPCI),
		newRoute(http.MethodGet, "/cluster/nextid", classNextID, sch(optional(vmidP)), (*Simulator).handleNextID),
		newRoute(http.MethodGet, "/pools", classOther, sch(optional(poolIDP), poolType), (*Simulator).handlePools),
		newRoute(http.MethodPost, "/pools", classOther, sch(poolIDP, param{name: "comment", kind: kString, optional: true, maxLen: 128}), (*Simulator).handleCreatePool),
		newRoute(http.MethodGet, "/pools/{poolid}", classOther, sch(poolIDP, poolType), (*Simulator).handleGetPool),
		newRoute(http.MethodGet, "/nodes/{node}/tasks/{upid}/status", classStatus, sch(nodeP, upidP), (*Simulator).handleTaskStatus),
		newRoute(http.MethodGet, "/nodes/{node}/tasks/{upid}/log", classStatus, sch(nodeP, upidP,
			param{name: "start", kind: kInt, optional: true, min: intPtr(0)}, param{name: "limit", kind: kInt, optional: true, min: intPtr(0)},
			param{name: "download", kind: kBool, optional: true}), (*Simulator).handleTaskLog),
		newRoute(http.MethodGet, "/nodes/{node}/qemu", classStatus, sch(nodeP, param{name: "full", kind: kBool, optional: true}), (*Simulator).handleListVMs),
		newRoute(http.MethodPost, "/nodes/{node}/qemu/{vmid}/clone", classClone, cloneSchema, (*Simulator).handleClone),
		newRoute(http.MethodGet, "/nodes/{node}/qemu/{vmid}/config", classStatus, sch(nodeP, vmidP,
			param{name: "current", kind: kBool, optional: true}, param{name: "snapshot", kind: kString, optional: true}), (*Simulator).handleGetConfig),
		newRoute(http.MethodGet, "/nodes/{node}/qemu/{vmid}/pending", classStatus, sch(nodeP, vmidP), (*Simulator).handleGetPending),
		newRoute(http.MethodGet, "/nodes/{node}/qemu/{vmid}/cloudinit/dump", classStatus, sch(nodeP, vmidP,
			param{name: "type", kind: kString, enum: []string{"user", "network", "meta"}}), (*Simulator).handleCloudInitDump),
		newRoute(http.MethodPost, "/nodes/{node}/qemu/{vmid}/config", classConfig, vmConfigSchema(), (*Simulator).handleConfigAsync),
		newRoute(http.MethodPut, "/nodes/{node}/qemu/{vmid}/config", classConfig, vmConfigSchema(), (*Simulator).handleConfigSync),
		newRoute(http.MethodPut, "/nodes/{node}/qemu/{vmid}/resize", classConfig, resizeSchema, (*Simulator).handleResize),
		newRoute(http.MethodGet, "/nodes/{node}/qemu/{vmid}/status/current", classStatus, sch(nodeP, vmidP), (*Simulator).handleStatusCurrent),
		newRoute(http.MethodPost, "/nodes/{node}/qemu/{vmid}/status/start", classPower, startSchema, (*Simulator).handleStart),
		newRoute(http.MethodPost, "/nodes/{node}/qemu/{vmid}/status/stop", classPower, stopSchema, (*Simulator).handleStop),
		newRoute(http.MethodPost, "/nodes/{node}/qemu/{vmid}/status/shutdown", classPower, shutdownSchema, (*Simulator).handleShutdown),
		newRoute(http.MethodPost, "/nodes/{node}/qemu/{vmid}/status/suspend", classPower, suspendSchema, (*Simulator).handleSuspend),
		newRoute(http.MethodPost, "/nodes/{node}/qemu/{vmid}/status/resume", classPower, resumeSchema, (*Simulator).handleResume),
		newRoute(http.MethodDelete, "/nodes/{node}/qemu/{vmid}", classDestroy, destroySchema, (*Simulator).handleDestroy),
		newRoute(http.MethodGet, "/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces", classAgent, sch(nodeP, vmidP), (*Simulator).handleAgentInterfaces),
		newRoute(http.MethodGet, "/nodes/{node}/qemu/{vmid}/agent/get-osinfo", classAgent, sch(nodeP, vmidP), (*Simulator).handleAgentOSInfo),
		newRoute(http.MethodGet, "/nodes/{node}/qemu/{vmid}/agent/get-host-name", classAgent, sch(nodeP, vmidP), (*Simulator).handleAgentHostName),
		newRoute(http.MethodPost, "/nodes/{node}/qemu/{vmid}/agent/ping", classAgent, sch(nodeP, vmidP), (*Simulator).handleAgentPing),
		newRoute(http.MethodPost, "/nodes/{node}/qemu/{vmid}/agent/file-write", classAgent, sch(nodeP, vmidP,
			param{name: "file", kind: kString}, param{name: "content", kind: kString, maxLen: maxFileWriteContent},
			param{name: "encode", kind: kBool, optional: true}), (*Simulator).handleAgentFileWrite),
		newRoute(http.MethodGet, "/nodes/{node}/storage", classStorage, sch(nodeP,
			param{name: "content", kind: kString, optional: true}, param{name: "enabled", kind: kBool, optional: true},
			param{name: "format", kind: kBool, optional: true}, param{name: "storage", kind: kString, optional: true},
			param{name: "target", kind: kString, optional: true}), (*Simulator).handleNodeStorages),
		newRoute(http.MethodGet, "/nodes/{node}/storage/{storage}/status", classStorage, sch(nodeP, storageP), (*Simulator).handleStorageStatus),
		newRoute(http.MethodGet, "/nodes/{node}/storage/{storage}/content", classStorage, sch(nodeP, storageP,
			param{name: "content", kind: kString, optional: true}, optional(vmidP)), (*Simulator).handleListContent),
		newRoute(http.MethodGet, "/nodes/{node}/storage/{storage}/content/{volume...}", classStorage, sch(nodeP, storageP, volumeP), (*Simulator).handleGetContent),
		newRoute(http.MethodDelete, "/nodes/{node}/storage/{storage}/content/{volume...}", classStorage, sch(nodeP, storageP, volumeP,
			param{name: "delay", kind: kInt, optional: true, min: intPtr(1), max: intPtr(30)}), (*Simulator).handleDeleteContent),
		newRoute(http.MethodPost, "/nodes/{node}/storage/{storage}/upload", classUpload, uploadSchema, (*Simulator).handleUpload),
	}, firewallRoutes()...)
}

// sortedKeys returns the keys of m in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
