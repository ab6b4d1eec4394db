package machineclaim

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/netcheck"
)

// runRound runs every check of plan, each kind's targets in parallel and
// the kinds in a fixed order (forward, reverse, ping, ssh), each target
// bounded by its kind's timeout. The first failed kind gives the round's
// reason.
func runRound(plan validationPlan) validationRound {
	var round validationRound
	add := func(check hfv1.NetworkCheck, reason hfv1.ConditionReason, fail bool, run func() outcome) {
		start := time.Now()
		o := run()
		ok, err, why := o.passed, o.err, o.reason
		metrics.NetworkValidationSeconds.WithLabelValues(string(check)).Observe(time.Since(start).Seconds())
		res := hfv1.NetworkCheckResult{Check: check, Passed: err == nil, Message: conditions.Truncate(ok, 1024)}
		result := "passed"
		if err != nil {
			result = "failed"
			res.Message = conditions.Truncate(err.Error(), 1024)
			if why != "" {
				reason = why
			}
			if round.reason == "" {
				round.reason = reason
			}
			// Any failed kind whose policy is FailClaim fails the claim,
			// not only the first.
			round.fail = round.fail || fail
		}
		metrics.NetworkValidations.WithLabelValues(plan.cluster, string(check), result).Inc()
		round.results = append(round.results, res)
	}
	if plan.dns {
		add(hfv1.CheckForward, hfv1.DNSLookupFailedReason, plan.failDNS, plan.forward)
		if plan.reverse {
			add(hfv1.CheckReverse, hfv1.ReverseLookupMismatchReason, plan.failDNS, plan.reverseLookups)
		}
	}
	if plan.ping {
		add(hfv1.CheckPing, hfv1.PingFailedReason, plan.failNetwork, plan.pings)
	}
	if plan.ssh {
		add(hfv1.CheckSSH, hfv1.SSHUnreachableReason, plan.failNetwork, plan.sshs)
	}
	return round
}

// outcome is one kind of check's: what passed, or the error and, when
// it is not the kind's usual one, the condition reason.
type outcome struct {
	passed string
	err    error
	reason hfv1.ConditionReason
}

// notPossible says why the DNS checks cannot run, "" when they can.
func (p validationPlan) notPossible() string {
	switch {
	case p.name == "":
		return "the VM has no FQDN (status.network.fqdn): set spec.dns.domain or the template's network.dns.domain"
	case len(p.servers) == 0:
		return fmt.Sprintf("HypervisorCluster %s configures no DNS server: set its spec.dns.servers (a template's network.dns.servers are its VMs' resolvers only, never checked)", p.cluster)
	}
	return ""
}

// forward checks the FQDN at every server.
func (p validationPlan) forward() outcome {
	if why := p.notPossible(); why != "" {
		return outcome{err: fmt.Errorf("forward lookup not possible: %s", why), reason: hfv1.ValidationNotPossibleReason}
	}
	err := each(len(p.servers), p.dnsTimeout, func(ctx context.Context, i int) error {
		return netcheck.Forward(ctx, p.servers[i], p.name, p.addrs)
	})
	if err != nil {
		return outcome{err: fmt.Errorf("forward lookup: %w", err)}
	}
	return outcome{passed: fmt.Sprintf("%s resolves to %s at %s", p.name, addrList(p.addrs), servers(p.servers))}
}

// reverseLookups checks each address's PTR at every server.
func (p validationPlan) reverseLookups() outcome {
	if why := p.notPossible(); why != "" {
		return outcome{err: fmt.Errorf("reverse lookup not possible: %s", why), reason: hfv1.ValidationNotPossibleReason}
	}
	n := len(p.addrs)
	err := each(len(p.servers)*n, p.dnsTimeout, func(ctx context.Context, i int) error {
		return netcheck.Reverse(ctx, p.servers[i/n], p.addrs[i%n], p.name)
	})
	if err != nil {
		return outcome{err: fmt.Errorf("reverse lookup: %w", err)}
	}
	return outcome{passed: fmt.Sprintf("the PTR records of %s name %s at %s", addrList(p.addrs), p.name, servers(p.servers))}
}

// pings checks that every address answers ICMP echo.
func (p validationPlan) pings() outcome {
	var mu sync.Mutex
	var rtts []string
	err := each(len(p.addrs), p.netTimeout, func(ctx context.Context, i int) error {
		rtt, err := netcheck.Ping(ctx, p.addrs[i])
		if err == nil {
			mu.Lock()
			rtts = append(rtts, fmt.Sprintf("%s in %s", p.addrs[i], rtt.Round(time.Microsecond)))
			mu.Unlock()
		}
		return err
	})
	if errors.Is(err, netcheck.ErrNotPermitted) {
		return outcome{err: fmt.Errorf("ping: %w", err), reason: hfv1.PingNotPermittedReason}
	}
	if err != nil {
		return outcome{err: fmt.Errorf("ping: %w", err)}
	}
	return outcome{passed: "ping answered by " + strings.Join(rtts, ", ")}
}

// sshRetry is how soon an SSH check that found no server tries again.
const sshRetry = time.Second

// sshs checks that an SSH server shows its host key on every address
// within the check's timeout. A VM is validated as soon as it reports an
// address, which is often before its SSH server has started (cloud-init
// makes its host keys first): a refused or unanswered connection is tried
// again every sshRetry until the timeout, and only then reported.
func (p validationPlan) sshs() outcome {
	var mu sync.Mutex
	var keys []string
	err := each(len(p.addrs), p.netTimeout, func(ctx context.Context, i int) error {
		key, err := sshWithin(ctx, netip.AddrPortFrom(p.addrs[i], p.sshPort))
		if err == nil {
			mu.Lock()
			keys = append(keys, fmt.Sprintf("%s (%s %s)", p.addrs[i], key.Type, key.Fingerprint))
			mu.Unlock()
		}
		return err
	})
	if err != nil {
		return outcome{err: fmt.Errorf("SSH on port %d: %w", p.sshPort, err)}
	}
	return outcome{passed: fmt.Sprintf("SSH on port %d answered by %s", p.sshPort, strings.Join(keys, ", "))}
}

// sshWithin reads addr's SSH host key, trying again every sshRetry until
// ctx ends; the error is the last attempt's.
func sshWithin(ctx context.Context, addr netip.AddrPort) (netcheck.HostKey, error) {
	for {
		key, err := netcheck.SSH(ctx, addr)
		if err == nil {
			return key, nil
		}
		select {
		case <-ctx.Done():
			return key, err
		case <-time.After(sshRetry):
		}
	}
}

// each runs check for 0..n-1 in parallel, each bounded by timeout, and
// joins the errors.
func each(n int, timeout time.Duration, check func(ctx context.Context, i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			errs[i] = check(ctx, i)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func servers(s []netip.AddrPort) string {
	parts := make([]string, len(s))
	for i, a := range s {
		parts[i] = a.Addr().String()
	}
	return strings.Join(parts, ", ")
}
