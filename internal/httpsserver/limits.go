package httpsserver

import (
	"fmt"
	"net"
	"sync"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/hyperfleet/hyperfleet/internal/metrics"
)

// Limits cap the connections a server holds open (docs/security.md,
// "The agent server's bounds"). A connection beyond a cap is closed as
// soon as it is accepted, before its TLS handshake: it costs the server a
// file descriptor for a moment and nothing else.
type Limits struct {
	// MaxConns caps the server's open connections from all clients
	// together; 0: no cap.
	MaxConns int
	// MaxConnsPerAddress caps the open connections from one source IP
	// address; 0: no cap. Behind a proxy or load balancer every
	// connection comes from the proxy's addresses: raise it to MaxConns,
	// or set it to 0, there.
	MaxConnsPerAddress int
	// SocketBuffer caps each connection's kernel send and receive buffers
	// (SO_SNDBUF, SO_RCVBUF) in bytes; 0: the kernel's autotuning. A
	// client that stops reading (a zero-window download) or stops sending
	// lets the kernel fill these buffers, up to net.ipv4.tcp_wmem's
	// maximum (4 MiB by default) per connection: memory outside the
	// process's RSS but charged to its cgroup, so to the pod's limit.
	// Capped, MaxConns x 2 x SocketBuffer (Linux doubles the value set)
	// bounds it.
	SocketBuffer int
	// Reserved is how many of MaxConns are kept for requests the server
	// classifies as reserved (Options.Classify: the agent server's
	// credential broker, TPM enrollment and hints), so that downloads,
	// and whatever else holds connections long, cannot take them: once
	// MaxConns-Reserved connections are held, a new one is admitted into
	// the reserve, where its first request must be a reserved one (any
	// other is answered 503 and the connection closed at its request
	// line) and it carries that one request only. 0: none. It needs a
	// MaxConns and a server that classifies requests.
	Reserved int
	// ReservedPerAddress caps the reserved connections one source address
	// holds, so that a few addresses cannot take the reserve either; 0
	// with a Reserved: 1.
	ReservedPerAddress int
}

// Or fills in a server's defaults: a cap of 0 becomes d's, a negative
// one no cap (0). Options of the servers use it, so that a zero value is
// bounded and "no cap" is said explicitly.
func (l Limits) Or(d Limits) Limits {
	pick := func(v, def int) int {
		switch {
		case v == 0:
			return def
		case v < 0:
			return 0
		}
		return v
	}
	return Limits{
		MaxConns: pick(l.MaxConns, d.MaxConns), MaxConnsPerAddress: pick(l.MaxConnsPerAddress, d.MaxConnsPerAddress),
		SocketBuffer: pick(l.SocketBuffer, d.SocketBuffer),
		Reserved:     pick(l.Reserved, d.Reserved), ReservedPerAddress: pick(l.ReservedPerAddress, d.ReservedPerAddress),
	}
}

// Check says what is wrong with l, naming the flags of the server whose
// prefix is given (such as "agent-server"): a reserve without a global cap
// to take it from, or as large as it.
func (l Limits) Check(prefix string) error {
	switch {
	case l.Reserved > 0 && l.MaxConns <= 0:
		return fmt.Errorf("--%s-reserved-conns is %d but --%s-max-conns sets no cap to keep them from: set a cap, or no reserve (-1)", prefix, l.Reserved, prefix)
	case l.Reserved > 0 && l.Reserved >= l.MaxConns:
		return fmt.Errorf("--%s-reserved-conns (%d) must be smaller than --%s-max-conns (%d): the reserve is a part of the cap", prefix, l.Reserved, prefix, l.MaxConns)
	}
	return nil
}

// general is how many connections are admitted before the reserve is
// used: all of MaxConns without one.
func (l Limits) general() int {
	if l.Reserved <= 0 || l.MaxConns <= 0 {
		return l.MaxConns
	}
	return l.MaxConns - l.Reserved
}

// reservedPerAddress is ReservedPerAddress, at least 1.
func (l Limits) reservedPerAddress() int {
	return max(1, l.ReservedPerAddress)
}

// Refusal reasons (the reason label of
// hyperfleet_https_connections_refused_total).
const (
	ReasonMaxConns           = "max_conns"
	ReasonMaxConnsPerAddress = "max_conns_per_address"
	// ReasonReservedPerAddress: the general connections are all held,
	// and the source address holds its share of the reserve already.
	ReasonReservedPerAddress = "reserved_per_address"
)

var (
	connectionsRefused = metrics.NewCounterVec("https_connections_refused_total",
		"Connections the operator's HTTPS servers (server agent or webhook) closed at once because a connection cap was reached, by reason: max_conns (all clients), max_conns_per_address (one source address) or reserved_per_address (the general connections all held and the address holds its share of the reserve for the agent server's broker, enrollment and hints).",
		"server", "reason")
	connectionsOpen = metrics.NewGaugeVec("https_connections_open",
		"Connections the operator's HTTPS servers (server agent or webhook) hold open, handshaking ones included.",
		"server")
)

// LimitListener returns ln with l's caps applied: Accept closes every
// connection beyond a cap at once and waits for the next, so that the
// server never sees it; each refusal is counted in
// hyperfleet_https_connections_refused_total{server=server} and logged at
// debug level, with an Info line at most once every 10 s (with the number
// refused since the last line: RefusalLog). A connection's place is
// released when it is closed. A connection admitted into the reserve
// (Limits.Reserved) says so (Reserved).
func LimitListener(ln net.Listener, l Limits, server string, logger logr.Logger) net.Listener {
	return &limitListener{
		Listener: ln, limits: l, server: server, log: logger,
		perAddr: map[string]int{}, reservedPerAddr: map[string]int{}, gauge: connectionsOpen.WithLabelValues(server),
		refusals: &RefusalLog{Message: "Refusing connections: a connection cap is reached (see hyperfleet_https_connections_refused_total)"},
	}
}

type limitListener struct {
	net.Listener
	limits   Limits
	server   string
	log      logr.Logger
	gauge    prometheus.Gauge
	refusals *RefusalLog

	mu      sync.Mutex
	total   int
	perAddr map[string]int
	// reserved and reservedPerAddr count the connections in the reserve.
	reserved        int
	reservedPerAddr map[string]int
}

// Accept implements net.Listener.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := sourceAddress(c.RemoteAddr())
		reserved, reason := l.take(addr)
		if reason != "" {
			// Counted before the close: whoever sees the connection
			// closed (a client, a test) finds the refusal counted.
			l.refused(reason, addr)
			_ = c.Close()
			continue
		}
		if tcp, ok := c.(*net.TCPConn); ok && l.limits.SocketBuffer > 0 {
			// Best effort: a buffer the kernel refuses leaves autotuning on,
			// which the connection caps still bound.
			_ = tcp.SetWriteBuffer(l.limits.SocketBuffer)
			_ = tcp.SetReadBuffer(l.limits.SocketBuffer)
		}
		l.gauge.Inc()
		return &limitedConn{Conn: c, reserved: reserved, release: func() { l.release(addr, reserved) }}, nil
	}
}

// take counts a new connection from addr in, in the reserve or not, or
// says which cap refuses it.
func (l *limitListener) take(addr string) (reserved bool, refusedBy string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.limits.MaxConns > 0 && l.total >= l.limits.MaxConns:
		return false, ReasonMaxConns
	case l.limits.MaxConnsPerAddress > 0 && l.perAddr[addr] >= l.limits.MaxConnsPerAddress:
		return false, ReasonMaxConnsPerAddress
	case l.limits.MaxConns > 0 && l.total-l.reserved >= l.limits.general():
		if l.reservedPerAddr[addr] >= l.limits.reservedPerAddress() {
			return false, ReasonReservedPerAddress
		}
		reserved = true
		l.reserved++
		l.reservedPerAddr[addr]++
	}
	l.total++
	l.perAddr[addr]++
	return reserved, ""
}

func (l *limitListener) release(addr string, reserved bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.perAddr[addr]--; l.perAddr[addr] <= 0 {
		delete(l.perAddr, addr)
	}
	if reserved {
		l.reserved--
		if l.reservedPerAddr[addr]--; l.reservedPerAddr[addr] <= 0 {
			delete(l.reservedPerAddr, addr)
		}
	}
	l.gauge.Dec()
}

// held is how many connections the listener holds now, in all and from
// addr (a source IP address).
func (l *limitListener) held(addr string) (total, fromAddr int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total, l.perAddr[addr]
}

func (l *limitListener) refused(reason, addr string) {
	connectionsRefused.WithLabelValues(l.server, reason).Inc()
	l.refusals.Refused(l.log, reason, "Refused a connection: a connection cap is reached",
		"server", l.server, "source", addr, "maxConns", l.limits.MaxConns, "maxConnsPerAddress", l.limits.MaxConnsPerAddress,
		"reservedConns", l.limits.Reserved)
}

// sourceAddress is the IP address a connection comes from, without its
// port: what the per-address cap counts by.
func sourceAddress(a net.Addr) string {
	if tcp, ok := a.(*net.TCPAddr); ok {
		return tcp.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// limitedConn releases its place in the caps once, when closed.
type limitedConn struct {
	net.Conn
	// reserved: admitted into the reserve (Limits.Reserved).
	reserved bool
	once     sync.Once
	release  func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// LimiterOr is l, or when l is nil the default bound on the requests all
// VMs together make to an endpoint whose every request costs the operator
// work (the credential broker's CI platform calls, TPM enrollment's RSA
// and Secret reads): 10 a second, in bursts of 20.
func LimiterOr(l *rate.Limiter) *rate.Limiter {
	if l == nil {
		return rate.NewLimiter(10, 20)
	}
	return l
}
