package spire

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hyperfleet/hyperfleet/pkg/errclass"
)

// TestUnavailableSocketPermission: gRPC reports an admin socket the
// operator may not connect to as Unavailable, like a server that is not up;
// the dialer's error tells them apart. (The tests run as root, for whom
// no socket is closed, so the dialer's error is set here.)
func TestUnavailableSocketPermission(t *testing.T) {
	c := &Client{notAdminHint: "fix the socket"}
	unavailable := status.Error(codes.Unavailable, "connection error")
	if err := c.wrap("op", unavailable); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Unavailable without a dial error: %v, want ErrUnavailable", err)
	}
	c.dialErr = &net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	if err := c.wrap("op", unavailable); !errors.Is(err, ErrUnavailable) || errclass.Classify(err) != errclass.ClassTransient {
		t.Fatalf("Unavailable after a refused connection: %v, want ErrUnavailable", err)
	}
	c.dialErr = &net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", syscall.EACCES)}
	err := c.wrap("op", unavailable)
	if !errors.Is(err, ErrNotAdmin) || errclass.Classify(err) != errclass.ClassConfiguration {
		t.Fatalf("Unavailable after a denied connection: %v, want ErrNotAdmin", err)
	}
	if want := fmt.Sprintf("op: %v (fix the socket): ", ErrNotAdmin); err.Error()[:len(want)] != want {
		t.Fatalf("message %q does not start with %q", err, want)
	}
}

// TestIsDuplicateJoinToken: the words of each SQL datastore for a token
// that exists, and nothing else.
func TestIsDuplicateJoinToken(t *testing.T) {
	for msg, want := range map[string]bool{
		"failed to create token: datastore-sql: UNIQUE constraint failed: join_tokens.token":                                   true,
		`failed to create token: datastore-sql: pq: duplicate key value violates unique constraint "uix_join_tokens_token"`:    true,
		"failed to create token: datastore-sql: Error 1062: Duplicate entry 'x' for key 'uix_join_tokens_token'":               true,
		"failed to create token: datastore-sql: database is locked":                                                            false,
		"failed to create join token registration entry: datastore-sql: UNIQUE constraint failed: registered_entries.entry_id": false,
	} {
		if got := isDuplicateJoinToken(status.Error(codes.Internal, msg)); got != want {
			t.Errorf("isDuplicateJoinToken(%q) = %v, want %v", msg, got, want)
		}
	}
	if isDuplicateJoinToken(status.Error(codes.Unavailable, "failed to create token: UNIQUE constraint failed")) {
		t.Error("an Unavailable answer counts as a duplicate token")
	}
}
