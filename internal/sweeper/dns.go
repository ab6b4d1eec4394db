package sweeper

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
)

// dnsSweepTimeout bounds one cluster's DNS sweep: the zone transfers of
// its zones and the removals.
const dnsSweepTimeout = 30 * time.Second

// orphanName is a DNS name carrying this install's marker whose claim was
// not found.
type orphanName struct {
	firstSeen time.Time
	rec       dnsreg.Record
}

// liveDNSOwners are the UIDs of the claims that may own DNS records: all
// but the finished ones. A claim removes its records as it ends, before it
// finishes; one kept as history after it gave the removal up must not keep
// them forever.
func liveDNSOwners(claims []hfv1.MachineClaim) map[string]bool {
	return claimSet(claims, func(c *hfv1.MachineClaim) (string, bool) { return string(c.UID), !c.IsFinished() })
}

// sweepDNS removes the DNS records this install registered for claims that
// no longer exist, on every cluster that registers VMs and whose DNS
// service works. A name is removed when it carries this install's marker
// (List by install owner), its claim is neither in the cache nor, read
// from the API server, anywhere (or finished), and it has been so for the
// grace period; Remove deletes only what the marker says HyperFleet wrote.
func (s *Sweeper) sweepDNS(ctx context.Context, live map[string]bool, confirm func() ([]hfv1.MachineClaim, error)) {
	if s.DNS == nil || s.Signer == nil {
		return
	}
	listed := map[string]bool{}
	for _, cluster := range s.DNS.Names() {
		dc, _ := s.DNS.Get(cluster)
		if dc.CheckErr != nil {
			// Its DNSReady condition says why; the names wait.
			keepListed(s, s.dnsNames, cluster+"/", listed)
			continue
		}
		if err := s.sweepDNSCluster(ctx, cluster, dc.Registrar, live, confirm, listed); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "DNS record sweep failed", "HypervisorCluster", cluster)
			keepListed(s, s.dnsNames, cluster+"/", listed)
		}
	}
	// Forget the names no longer listed (removed by their claim, or by
	// hand) and those of clusters that no longer register VMs.
	forgetUnlisted(s, s.dnsNames, "", listed, nil)
}

func (s *Sweeper) sweepDNSCluster(ctx context.Context, cluster string, reg dnsreg.Registrar, live map[string]bool, confirm func() ([]hfv1.MachineClaim, error), listed map[string]bool) error {
	ctx, cancel := context.WithTimeout(ctx, dnsSweepTimeout)
	defer cancel()
	metrics.SweepingDNS(cluster)
	recs, err := reg.List(ctx, dnsreg.Owner{Install: s.Signer.OperatorID()})
	if err != nil {
		return fmt.Errorf("list the DNS records of HypervisorCluster %s: %w", cluster, err)
	}
	now := s.Clock.Now()
	for _, rec := range recs {
		if live[rec.Owner.Claim] {
			continue
		}
		k := cluster + "/" + dnsreg.Fqdn(rec.Name) + "/" + rec.Owner.Claim
		listed[k] = true
		o := s.orphanName(ctx, cluster, k, rec, now)
		remove, err := removable(s, s.dnsNames, k, o.firstSeen, now, confirm,
			func(claims []hfv1.MachineClaim) bool { return liveDNSOwners(claims)[rec.Owner.Claim] })
		if err != nil {
			return err
		}
		if !remove {
			continue
		}
		if err := reg.Remove(ctx, rec); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Remove orphaned DNS records", "HypervisorCluster", cluster, "name", rec.Name)
			continue
		}
		delete(listed, k)
		metrics.OrphanDNSRemoved.WithLabelValues(cluster).Inc()
		s.event(ctx, cluster, corev1.EventTypeNormal, "OrphanDNSRemoved",
			fmt.Sprintf("Removed the DNS records of %s (addresses %s) of deleted claim %s", dnsreg.Fqdn(rec.Name), addrs(rec), rec.Owner.Claim))
		ctrl.LoggerFrom(ctx).Info("Removed orphaned DNS records", "HypervisorCluster", cluster, "name", rec.Name, "claimUID", rec.Owner.Claim)
	}
	return nil
}

// orphanName returns the record of a name without a live claim, reporting
// it the first time.
func (s *Sweeper) orphanName(ctx context.Context, cluster, k string, rec dnsreg.Record, now time.Time) *orphanName {
	o, first := sighting(s, s.dnsNames, k, func() *orphanName { return &orphanName{firstSeen: now, rec: rec} })
	if !first {
		return o
	}
	metrics.OrphanDNSFound.WithLabelValues(cluster).Inc()
	mode := s.graceMode("its records", "removed")
	ctrl.LoggerFrom(ctx).Info("Found DNS records without a MachineClaim", "HypervisorCluster", cluster, "name", rec.Name, "claimUID", rec.Owner.Claim, "dryRun", s.DryRun)
	s.event(ctx, cluster, corev1.EventTypeWarning, "OrphanDNSFound",
		fmt.Sprintf("DNS name %s (addresses %s) was registered for claim %s, which no longer exists; %s", dnsreg.Fqdn(rec.Name), addrs(rec), rec.Owner.Claim, mode))
	return o
}

func addrs(rec dnsreg.Record) string {
	parts := make([]string, len(rec.Addrs))
	for i, a := range rec.Addrs {
		parts[i] = a.String()
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// DNSOrphans returns the DNS names currently known as orphans, by
// "cluster/name/claim UID".
func (s *Sweeper) DNSOrphans() []string {
	s.defaults()
	return known(s, s.dnsNames)
}
