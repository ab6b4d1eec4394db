package spire

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hyperfleet/hyperfleet/pkg/errclass"
)

// Sentinel errors. The client wraps them, with the server's answer, so that
// callers branch with errors.Is and controllers classify with errclass: a
// refusal of the operator's identity or of a request is for the user to fix,
// anything else (the server restarting, a timeout, a datastore failure) is
// retried.
var (
	// ErrInvalidConfig: Dial was given a Config it cannot work with; the
	// message names the setting.
	ErrInvalidConfig = errclass.NewSentinel("invalid SPIRE server client configuration", errclass.ClassConfiguration, "SPIREConfigInvalid")
	// ErrNotAdmin: the server refused the operator as a caller of its
	// admin RPCs (PermissionDenied, Unauthenticated, or a unix socket the
	// operator may not connect to); the message names the fix.
	ErrNotAdmin = errclass.NewSentinel("the operator is not an admin of the SPIRE server", errclass.ClassConfiguration, "SPIRENotAdmin")
	// ErrInvalidArgument: the server (or the client, before asking it)
	// refused a request as invalid: a bug or a setting that yields ids the
	// server does not accept. Retrying does not help.
	ErrInvalidArgument = errclass.NewSentinel("the SPIRE server refused the request as invalid", errclass.ClassConfiguration, "SPIRERequestRefused")
	// ErrHandshake: with MTLS, the TLS handshake with the server failed:
	// its certificate does not carry Config.MTLS.ServerID or does not chain
	// to the operator's bundle (another trust domain), or the server refused
	// the operator's SVID.
	ErrHandshake = errclass.NewSentinel("the TLS handshake with the SPIRE server failed", errclass.ClassConfiguration, "SPIREHandshakeFailed")
	// ErrUnavailable: the server did not answer (Unavailable,
	// DeadlineExceeded); retry.
	ErrUnavailable = errclass.NewSentinel("the SPIRE server is unavailable", errclass.ClassTransient, "")
	// ErrEntryConflict: an entry with the id EnsureEntry was given exists
	// with another SPIFFE ID or parent, so the identity asked for is not the
	// one the server hands out. Something other than this client wrote it.
	ErrEntryConflict = errclass.NewSentinel("a registration entry with that id exists with other content", errclass.ClassPermanent, "SPIREEntryConflict")
)

// wrap turns an error of a Server API call into the client's error: op says
// what was asked, the sentinel what it means. Codes without a meaning of
// their own (Internal, Unknown ...) stay unclassified, hence transient.
func (c *Client) wrap(op string, err error) error {
	st, _ := status.FromError(err)
	switch st.Code() {
	case codes.PermissionDenied, codes.Unauthenticated:
		return fmt.Errorf("%s: %w (%s): %w", op, ErrNotAdmin, c.notAdminHint, err)
	case codes.InvalidArgument:
		return fmt.Errorf("%s: %w: %w", op, ErrInvalidArgument, err)
	case codes.Unavailable:
		// A unix socket the operator may not open is an answer, not an
		// outage: gRPC reports it as Unavailable, and only the dialer saw
		// the permission error.
		if d := c.lastDialErr(); d != nil && errors.Is(d, fs.ErrPermission) {
			return fmt.Errorf("%s: %w (%s): %w", op, ErrNotAdmin, c.notAdminHint, d)
		}
		// gRPC words a failed handshake so, and reports it as Unavailable
		// too; it does not heal by itself as an outage does.
		if c.source != nil && strings.Contains(st.Message(), "authentication handshake failed") {
			return fmt.Errorf("%s: %w (check Config.MTLS.ServerID and that the operator's agent is in trust domain %s): %w", op, ErrHandshake, c.td, err)
		}
		return fmt.Errorf("%s: %w: %w", op, ErrUnavailable, err)
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: %w: %w", op, ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// uniqueViolations are how the SQL datastores SPIRE supports word the
// violation of a unique index, as the server passes it on in the message of
// an Internal error (sqlite3 checked against the real server; PostgreSQL
// and MySQL from their drivers' messages).
var uniqueViolations = []string{
	"UNIQUE constraint failed",                       // sqlite3
	"duplicate key value violates unique constraint", // PostgreSQL
	"Duplicate entry",                                // MySQL
}

// isDuplicateJoinToken tells whether CreateJoinToken failed because the
// token exists. The server does not say so with a code of its own: its
// datastore answers AlreadyExists, but the agent service wraps that as
// Internal "failed to create token: datastore-sql: UNIQUE constraint
// failed: join_tokens.token", so only the message tells it from a broken
// datastore.
func isDuplicateJoinToken(err error) bool {
	st, _ := status.FromError(err)
	if st.Code() != codes.Internal && st.Code() != codes.AlreadyExists {
		return false
	}
	msg := st.Message()
	if !strings.HasPrefix(msg, "failed to create token") {
		return false
	}
	for _, v := range uniqueViolations {
		if strings.Contains(msg, v) {
			return true
		}
	}
	return false
}
