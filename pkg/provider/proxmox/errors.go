package proxmox

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox/privileges"
)

// apiError is one failed Proxmox API call as the API answered it.
type apiError struct {
	method   string
	endpoint string
	code     int
	// message is Proxmox's error text (the status line's reason, which
	// pveproxy sets to the handler's message).
	message string
	// params are the per-parameter messages of a 400.
	params map[string]string
}

func (e *apiError) Error() string {
	msg := e.message
	if len(e.params) > 0 {
		msg += " (" + formatParams(e.params) + ")"
	}
	return fmt.Sprintf("%s %s: %d %s", e.method, e.endpoint, e.code, msg)
}

func formatParams(params map[string]string) string {
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+": "+strings.TrimSpace(params[k]))
	}
	return strings.Join(parts, "; ")
}

// apiMessage returns Proxmox's message of an API or task error, "" if err is
// neither.
func apiMessage(err error) string {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.message
	}
	var te *taskError
	if errors.As(err, &te) {
		return te.exit
	}
	return ""
}

// paramMessage returns the 400 message for param, "" if none.
func paramMessage(err error, param string) string {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.params[param]
	}
	return ""
}

// taskError is a worker task that ended with an error exit status.
type taskError struct {
	op   string
	exit string
}

func (e *taskError) Error() string { return fmt.Sprintf("%s task failed: %s", e.op, e.exit) }

func (e *taskError) Unwrap() error { return provider.ErrTaskFailed }

// kind is what a Proxmox message means for the caller.
type kind struct {
	class    provider.Class
	reason   string
	sentinel error
}

// classifyMessage maps a Proxmox error message (a handler's die text or a
// task's exit status) to a class, by the patterns qemu-server, pve-storage
// and pve-cluster produce: Proxmox reports a handler's failure as a 500
// whose status line and message carry the die text (such as "VM is locked
// (clone)" or "Configuration file 'nodes/<node>/qemu-server/<vmid>.conf'
// does not exist"), and a task's failure as its exit status.
func classifyMessage(msg string) kind {
	m := strings.ToLower(msg)
	switch {
	case strings.Contains(m, "got timeout"), strings.Contains(m, "lock request timeout"),
		strings.Contains(m, "vm is locked"), strings.Contains(m, "can't lock file"):
		return kind{provider.ClassTransient, "LockTimeout", nil}
	case strings.Contains(m, "can't start a vm if it's a template"):
		return kind{provider.ClassPermanent, "TemplateStart", nil}
	case strings.Contains(m, "permission check failed"):
		return kind{provider.ClassConfiguration, "PermissionDenied", provider.ErrUnauthorized}
	case strings.Contains(m, "does not exist"), strings.Contains(m, "no such file"), strings.Contains(m, "no such task"):
		return kind{provider.ClassPermanent, "NotFound", provider.ErrNotFound}
	case strings.Contains(m, "connection refused"), strings.Contains(m, "no route to host"),
		strings.Contains(m, "timed out"), strings.Contains(m, "can't connect"):
		return kind{provider.ClassTransient, "Unreachable", provider.ErrUnreachable}
	case strings.Contains(m, "no space left"), strings.Contains(m, "not enough space"),
		strings.Contains(m, "out of memory"), strings.Contains(m, "cannot allocate memory"):
		return kind{provider.ClassResource, "InsufficientCapacity", provider.ErrNoCapacity}
	case strings.Contains(m, "already exists"):
		return kind{provider.ClassTransient, "AlreadyExists", nil}
	}
	return kind{provider.ClassTransient, "APIError", nil}
}

// httpError classifies a non-2xx answer.
func httpError(x *exchange, method, endpoint string) error {
	msg := x.reason
	if msg == "" || msg == http.StatusText(x.code) {
		if x.message != "" {
			msg = x.message
		}
	}
	ae := &apiError{method: method, endpoint: endpoint, code: x.code, message: msg, params: x.params}
	switch {
	case x.refusal != "":
		return clientCertRefused(method, endpoint, x.refusal)
	case x.code >= 300 && x.code < 400:
		return provider.Errorf(provider.ClassConfiguration, "Redirected",
			"%s %s: %w (%d to %q); set spec.endpoint to the URL the API answers at without a redirect", method, endpoint, errRedirect, x.code, x.location)
	case x.code == http.StatusUnauthorized:
		return provider.Errorf(provider.ClassConfiguration, "Unauthorized",
			"%w: %w; check credentials.tokenID and credentials.tokenSecret (or username and password)", provider.ErrUnauthorized, ae)
	case x.code == http.StatusForbidden:
		return provider.Errorf(provider.ClassConfiguration, "PermissionDenied",
			"%w: %w; %s", provider.ErrUnauthorized, ae, permissionFix(msg, method, endpoint))
	case x.code == 595:
		// pveproxy could not reach the node it proxies the call to.
		return provider.Errorf(provider.ClassTransient, "NodeOffline", "%w: %w", provider.ErrUnreachable, ae)
	case x.code == http.StatusBadRequest:
		if strings.Contains(ae.params["upid"], "no such task") {
			return provider.Errorf(provider.ClassPermanent, "NotFound", "%w: %w", provider.ErrNotFound, ae)
		}
		return provider.Errorf(provider.ClassConfiguration, "InvalidParameter", "Proxmox rejected a parameter: %w", ae)
	case x.code == http.StatusNotImplemented:
		return provider.Errorf(provider.ClassConfiguration, "NotImplemented",
			"%w; this Proxmox VE version lacks the call (HyperFleet needs PVE 8 or newer)", ae)
	case x.code == http.StatusBadGateway, x.code == http.StatusServiceUnavailable, x.code == http.StatusGatewayTimeout:
		return provider.Errorf(provider.ClassTransient, "Unreachable", "%w: %w", provider.ErrUnreachable, ae)
	}
	k := classifyMessage(msg)
	if k.reason == "PermissionDenied" {
		return provider.Errorf(k.class, k.reason, "%w: %w; %s", k.sentinel, ae, permissionFix(msg, method, endpoint))
	}
	if k.sentinel != nil {
		return provider.Errorf(k.class, k.reason, "%w: %w", k.sentinel, ae)
	}
	return provider.Errorf(k.class, k.reason, "%w", ae)
}

// permissionFix names what a "Permission check failed (<path>, <privs>)"
// lacks and the pveum command that grants it to the role of
// docs/install.md (step 2), whose privileges pkg/provider/proxmox/privileges
// derives from Proxmox's own checks.
//
// A bare "Permission check failed" is an 'or' group of the call's checks
// (clone's VM.Allocate on the new id or the pool): the table names it.
func permissionFix(msg, method, endpoint string) string {
	path, privs, ok := privileges.ParseDenied(msg)
	if !ok {
		c, found := privileges.Unnamed(privileges.PVE9, method, endpoint)
		if !found {
			return "grant the named privilege on the named path to the operator's Proxmox user or token"
		}
		return fmt.Sprintf("the operator's Proxmox token lacks %s on %s (or on %s); grant it: %s (the role of docs/install.md, step 2)",
			strings.Join(c.Privs, " and "), c.Path, c.OrPath, privileges.Fix(c.Privs[0]))
	}
	what := privs[0]
	if len(privs) > 1 {
		what = "any of " + strings.Join(privs, ", ")
	}
	return fmt.Sprintf("the operator's Proxmox token lacks %s on %s; grant it: %s (the role of docs/install.md, step 2, granted on %s or a parent)",
		what, path, privileges.Fix(privs[0]), path)
}

// transportError classifies a request that got no answer.
func transportError(ctx context.Context, err error, method, endpoint string) error {
	var pe *provider.Error
	if errors.As(err, &pe) {
		// The authenticator's login failure, already classified.
		return err
	}
	var (
		unknownAuth x509.UnknownAuthorityError
		hostname    x509.HostnameError
		invalid     x509.CertificateInvalidError
		verify      *tls.CertificateVerificationError
	)
	if errors.Is(err, errFingerprintMismatch) || errors.As(err, &unknownAuth) || errors.As(err, &hostname) ||
		errors.As(err, &invalid) || errors.As(err, &verify) {
		return provider.Errorf(provider.ClassConfiguration, "TLSVerificationFailed",
			"%s %s: the API certificate is not trusted: %w; set tls.caBundleRef to the cluster CA (/etc/pve/pve-root-ca.pem) or pin tls.fingerprintSHA256", method, endpoint, err)
	}
	if alert, ok := peerRefusedCertificate(err); ok {
		return provider.Errorf(provider.ClassConfiguration, reasonClientCertRefused,
			"%s %s: the TLS server in front of the Proxmox API refused the client certificate (%s): %w; set spec.credentials.clientCert to a certificate it trusts, valid now and allowing clientAuth",
			method, endpoint, alert, err)
	}
	if errors.Is(err, errForeignHost) {
		return provider.Errorf(provider.ClassConfiguration, "ForeignHost", "%s %s: %w; only spec.endpoint's host receives credentials", method, endpoint, err)
	}
	if ctx.Err() != nil && errors.Is(ctx.Err(), context.Canceled) {
		return provider.Errorf(provider.ClassTransient, "Canceled", "%s %s: %w", method, endpoint, ctx.Err())
	}
	return provider.Errorf(provider.ClassTransient, "Unreachable", "%w: %s %s: %w", provider.ErrUnreachable, method, endpoint, err)
}

// taskFailure classifies a task's error exit status.
func taskFailure(op, exit string) error {
	te := &taskError{op: op, exit: exit}
	k := classifyMessage(exit)
	if k.sentinel != nil {
		return provider.Errorf(k.class, k.reason, "%w (%w)", te, k.sentinel)
	}
	return provider.Errorf(k.class, k.reason, "%w", te)
}

// reasonOf is provider.ReasonOf, local for brevity.
func reasonOf(err error) string { return provider.ReasonOf(err) }

// isLock reports a lock wait that ran out or a locked config: worth a retry
// after a backoff.
func isLock(err error) bool { return reasonOf(err) == "LockTimeout" }

func isNotFound(err error) bool { return errors.Is(err, provider.ErrNotFound) }

// vmConfigMissing reports whether err is Proxmox saying that the config
// file of VM vmid does not exist on the node asked (qemu-server's "Configuration file
// 'nodes/<node>/qemu-server/<vmid>.conf' does not exist"). Of all the
// "does not exist" answers only this one is about the VM itself; a missing
// storage, volume, ISO or pool says nothing about whether the VM exists.
func vmConfigMissing(err error, vmid int) bool {
	return strings.Contains(apiMessage(err), fmt.Sprintf("/qemu-server/%d.conf' does not exist", vmid))
}

// otherMissing is a "does not exist" answer that is not about the VM a call
// was for. It keeps Proxmox's message (apiMessage still finds it) but not
// provider.ErrNotFound: *apiError does not unwrap to the sentinel.
type otherMissing struct{ ae *apiError }

func (e *otherMissing) Error() string { return e.ae.Error() }

func (e *otherMissing) Unwrap() error { return e.ae }

// aboutVM narrows the provider.ErrNotFound of a call about VM vmid to the
// VM's own absence (vmConfigMissing): any other "does not exist" becomes a
// transient error that no caller can take for "the VM is gone"
// (docs/security.md, "Absence and release").
func aboutVM(err error, vmid int) error {
	if err == nil || !isNotFound(err) || vmConfigMissing(err, vmid) {
		return err
	}
	return withoutNotFound(err, fmt.Sprintf("Proxmox names something other than VM %d missing; the VM may still exist", vmid))
}

// withoutNotFound re-classifies a "does not exist" API answer as a
// transient MissingReference error without provider.ErrNotFound, with note
// saying why. Errors that are not API answers are returned unchanged.
func withoutNotFound(err error, note string) error {
	var ae *apiError
	if !isNotFound(err) || !errors.As(err, &ae) {
		return err
	}
	return provider.Errorf(provider.ClassTransient, "MissingReference", "%w; %s", &otherMissing{ae: ae}, note)
}

// withField re-classifies an error as one the user fixes in field.
func withField(err error, field, hint string) error {
	return provider.Errorf(provider.ClassConfiguration, reasonOf(err), "%s: %w; %s", field, err, hint)
}
