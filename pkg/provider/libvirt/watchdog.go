package libvirt

import (
	"encoding/binary"
	"net"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt/socket"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// go-libvirt takes no context and sets no deadline: a call to a libvirtd
// that stops answering (a hung daemon, a host behind a partition whose TCP
// connection stays up) waits for ever, and with it the reconcile that made
// it. A watchedConn bounds each call by the cluster's RequestTimeout
// instead: it reads the RPC headers going out and coming back (libvirt's
// framing: a 4-byte length, then program, version, procedure, type, serial
// and status, 4 bytes each), and closes the connection when a call has had
// no reply for that long. go-libvirt then fails every call in flight
// (ErrInterrupted, transient here), and the next call connects again.
// Events (type message) need no reply and the idle connection none: only
// unanswered calls count. Seeing each call and its reply, it also reports
// them to the provider's Observer (the hypervisor API metrics): method the
// protocol, endpoint the procedure (procnames.go), code 200 for a reply,
// 500 for an error reply and 0 for none (as the HTTP statuses of the
// Proxmox provider's calls).

// defaultRequestTimeout bounds a call when the cluster's configuration
// sets no RequestTimeout.
const defaultRequestTimeout = 30 * time.Second

const (
	// rpcHeaderSize is the length field and the header of an RPC packet.
	rpcHeaderSize = 28
	// remoteProgram is libvirt's REMOTE_PROGRAM.
	remoteProgram = 0x20008086
	// procStorageVolCreateXMLFrom (REMOTE_PROC_STORAGE_VOL_CREATE_XML_FROM)
	// is a full copy of a template's disk, answered when the copy ends:
	// minutes for a large disk, so it is not bounded (disk.go runs it in
	// the background and follows it).
	procStorageVolCreateXMLFrom = 125
	// procDomainManagedSave (REMOTE_PROC_DOMAIN_MANAGED_SAVE) and
	// procDomainCreateWithFlags (REMOTE_PROC_DOMAIN_CREATE_WITH_FLAGS,
	// which the provider calls only to restore a suspended domain) are
	// answered when the guest's memory is written or read back: not
	// bounded either (suspend.go runs them in the background).
	procDomainManagedSave     = 182
	procDomainCreateWithFlags = 196

	rpcCall  = 0 // socket.Call
	rpcReply = 1 // socket.Reply
	rpcData  = 3 // socket.Stream: a stream call's data and its end

	rpcStatusError = 1 // socket.StatusError
)

// watchDialer is a socket.Dialer whose connections are watchedConns.
type watchDialer struct {
	socket.Dialer
	timeout time.Duration
	obs     provider.Observer
}

// Dial implements socket.Dialer.
func (d watchDialer) Dial() (net.Conn, error) {
	c, err := d.Dialer.Dial()
	if err != nil {
		return nil, err
	}
	return watch(c, d.timeout, d.obs), nil
}

// watchedConn is a connection to libvirtd closed when a call goes
// unanswered for longer than timeout.
type watchedConn struct {
	net.Conn
	timeout time.Duration
	obs     provider.Observer

	mu sync.Mutex
	// sent are the calls waiting for their reply, by serial.
	sent map[uint32]sentCall
	// out and in follow the packets written and read.
	out, in rpcFramer

	stop      chan struct{}
	closeOnce sync.Once
}

// sentCall is a call waiting for its reply.
type sentCall struct {
	at                 time.Time
	program, procedure uint32
}

func watch(c net.Conn, timeout time.Duration, obs provider.Observer) *watchedConn {
	w := &watchedConn{Conn: c, timeout: timeout, obs: obs, sent: map[uint32]sentCall{}, stop: make(chan struct{})}
	go w.watch()
	return w
}

// report hands a call's outcome to the Observer.
func (w *watchedConn) report(c sentCall, code int, now time.Time) {
	method, endpoint := callName(c.program, c.procedure)
	w.obs.APICall(method, endpoint, code, now.Sub(c.at))
}

// Write implements net.Conn: a call packet starts its clock.
func (w *watchedConn) Write(b []byte) (int, error) {
	w.mu.Lock()
	now := time.Now()
	w.out.feed(b, func(h rpcHeader) {
		if h.typ == rpcCall {
			w.sent[h.serial] = sentCall{at: now, program: h.program, procedure: h.procedure}
		}
	})
	w.mu.Unlock()
	return w.Conn.Write(b)
}

// Read implements net.Conn: a reply (or a stream call's first data)
// stops its call's clock.
func (w *watchedConn) Read(b []byte) (int, error) {
	n, err := w.Conn.Read(b)
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.in.feed(b[:n], func(h rpcHeader) {
		c, ok := w.sent[h.serial]
		if !ok || h.typ != rpcReply && h.typ != rpcData {
			return
		}
		delete(w.sent, h.serial)
		code := 200
		if h.status == rpcStatusError {
			code = 500
		}
		w.report(c, code, now)
	})
	if err != nil {
		// The connection is gone: no call in flight gets its reply.
		for serial, c := range w.sent {
			delete(w.sent, serial)
			w.report(c, 0, now)
		}
	}
	return n, err
}

// Close implements net.Conn.
func (w *watchedConn) Close() error {
	w.closeOnce.Do(func() { close(w.stop) })
	return w.Conn.Close()
}

// watch closes the connection once a call has waited longer than timeout.
func (w *watchedConn) watch() {
	tick := time.NewTicker(max(w.timeout/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-w.stop:
			return
		case now := <-tick.C:
			if w.overdue(now) {
				_ = w.Close()
				return
			}
		}
	}
}

// overdue says whether a call sent before now-timeout is unanswered.
func (w *watchedConn) overdue(now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.sent {
		if now.Sub(c.at) > w.timeout && !c.unbounded() {
			return true
		}
	}
	return false
}

// unbounded says whether the call may take longer than any timeout: a
// full copy, a managed save or a restore, answered when the copy, the
// save or the restore ends.
func (c sentCall) unbounded() bool {
	if c.program != remoteProgram {
		return false
	}
	switch c.procedure {
	case procStorageVolCreateXMLFrom, procDomainManagedSave, procDomainCreateWithFlags:
		return true
	}
	return false
}

// rpcHeader is what the watchdog reads of a packet's header.
type rpcHeader struct {
	program, procedure, typ, serial, status uint32
}

// rpcFramer follows libvirt's packets through a byte stream cut
// anywhere: it gathers each packet's header and passes over its payload.
type rpcFramer struct {
	head [rpcHeaderSize]byte
	n    int // bytes of head gathered
	skip int // payload bytes of the current packet still to pass over
}

// feed passes b through the framer, calling packet for each header it
// completes.
func (f *rpcFramer) feed(b []byte, packet func(rpcHeader)) {
	for len(b) > 0 {
		if f.skip > 0 {
			k := min(f.skip, len(b))
			f.skip -= k
			b = b[k:]
			continue
		}
		k := copy(f.head[f.n:], b)
		f.n += k
		b = b[k:]
		if f.n < rpcHeaderSize {
			return
		}
		be := binary.BigEndian
		packet(rpcHeader{program: be.Uint32(f.head[4:8]), procedure: be.Uint32(f.head[12:16]),
			typ: be.Uint32(f.head[16:20]), serial: be.Uint32(f.head[20:24]), status: be.Uint32(f.head[24:28])})
		f.n, f.skip = 0, max(int(be.Uint32(f.head[0:4]))-rpcHeaderSize, 0)
	}
}
