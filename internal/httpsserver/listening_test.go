package httpsserver

import (
	"net"
	"testing"
)

func TestListening(t *testing.T) {
	var l Listening
	if l.Addr() != nil {
		t.Fatalf("Addr before Listened = %v, want nil", l.Addr())
	}
	ready := l.Ready()
	select {
	case <-ready:
		t.Fatal("Ready is closed before MarkReady")
	default:
	}
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40123}
	l.Listened(addr)
	if got := l.Addr(); got != addr {
		t.Fatalf("Addr = %v, want %v", got, addr)
	}
	l.MarkReady()
	l.MarkReady() // a deferred second call, as Start makes, does nothing
	select {
	case <-ready:
	default:
		t.Fatal("Ready taken before MarkReady is still open after it")
	}
	if l.Ready() != ready {
		t.Fatal("Ready is a different channel on each call")
	}
}
