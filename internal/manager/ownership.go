package manager

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/clusterconfig"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Keys of the ownership Secret (docs/security.md, "Ownership keys").
const (
	// OwnershipKeyField is the first key of the ring, id 0; it is what the
	// manager writes when it creates the Secret.
	OwnershipKeyField = "hmac-key"
	// OwnershipKeyFieldPrefix starts the later keys of the ring:
	// hmac-key-<id>, id >= 1. New VMs are signed with the highest id.
	OwnershipKeyFieldPrefix  = OwnershipKeyField + "-"
	OwnershipOperatorIDField = "operator-id"
	// AllowNewOwnershipKeyFlag is the manager flag that lets a missing
	// ownership Secret be created although VMs may be signed with the lost
	// key.
	AllowNewOwnershipKeyFlag = "--allow-new-ownership-key"
)

// SignerOptions configure LoadOrCreateSigner.
type SignerOptions struct {
	// Namespace and Name locate the ownership Secret.
	Namespace, Name string
	// OperatorID is the id asked for (--operator-id); empty: the Secret's,
	// or a random one when the Secret is created.
	OperatorID string
	// AllowNewKey lets a missing Secret be created even when VMs that may
	// have been signed with a lost key exist, or when a cluster could not
	// be checked (--allow-new-ownership-key).
	AllowNewKey bool
	// Factories build the providers the existing-VM check lists clusters
	// with; nil means RegisteredFactories.
	Factories map[hfv1.HypervisorProvider]provider.Factory
}

// LoadOrCreateSigner reads the install's ownership key ring and operator id
// from a Secret. When the Secret does not exist it creates one with a
// random key (and id), but only after checking every HypervisorCluster for
// VMs that may belong to this install: such VMs were signed with a key that
// is now lost, and a new key would silently make every one of them foreign
// (never deleted by the operator, only by hand). With such VMs, or with a
// cluster that cannot be listed, it refuses unless opts.AllowNewKey.
//
// c must read Secrets and HypervisorClusters from the API server (not a
// cache that has not started).
func LoadOrCreateSigner(ctx context.Context, c client.Client, opts SignerOptions) (*ownership.Signer, error) {
	ref := opts.Namespace + "/" + opts.Name
	var s corev1.Secret
	err := c.Get(ctx, client.ObjectKey{Namespace: opts.Namespace, Name: opts.Name}, &s)
	switch {
	case apierrors.IsNotFound(err):
		if err := checkNoInstallVMs(ctx, c, opts); err != nil {
			return nil, err
		}
		if err := createOwnershipSecret(ctx, c, opts); err != nil {
			return nil, err
		}
		if err := c.Get(ctx, client.ObjectKey{Namespace: opts.Namespace, Name: opts.Name}, &s); err != nil {
			return nil, fmt.Errorf("read ownership Secret %s: %w", ref, err)
		}
	case err != nil:
		return nil, fmt.Errorf("read ownership Secret %s: %w", ref, err)
	}
	id := string(s.Data[OwnershipOperatorIDField])
	if opts.OperatorID != "" && id != opts.OperatorID {
		return nil, fmt.Errorf("ownership Secret %s belongs to operator id %q but --operator-id is %q; VMs are signed per id, so use %q or another Secret",
			ref, id, opts.OperatorID, id)
	}
	keys, err := ownershipKeys(s.Data)
	if err != nil {
		return nil, fmt.Errorf("ownership Secret %s: %w", ref, err)
	}
	signer, err := ownership.NewKeyRing(id, keys)
	if err != nil {
		return nil, fmt.Errorf("ownership Secret %s: %w", ref, err)
	}
	return signer, nil
}

// ownershipKeys reads the key ring: hmac-key is id 0, hmac-key-<n> is id n.
func ownershipKeys(data map[string][]byte) ([]ownership.Key, error) {
	var keys []ownership.Key
	for field, v := range data {
		switch {
		case field == OwnershipKeyField:
			keys = append(keys, ownership.Key{ID: 0, Secret: v})
		case strings.HasPrefix(field, OwnershipKeyFieldPrefix):
			n, err := strconv.Atoi(strings.TrimPrefix(field, OwnershipKeyFieldPrefix))
			if err != nil || n < 1 || strconv.Itoa(n) != strings.TrimPrefix(field, OwnershipKeyFieldPrefix) {
				return nil, fmt.Errorf("key %q: name ring keys %s<n> with n a number from 1 (the highest signs new VMs)", field, OwnershipKeyFieldPrefix)
			}
			keys = append(keys, ownership.Key{ID: n, Secret: v})
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("no key %q or %s<n>; restore the Secret from a backup (the key that signed the install's VMs)", OwnershipKeyField, OwnershipKeyFieldPrefix)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].ID < keys[j].ID })
	return keys, nil
}

// createOwnershipSecret writes a new Secret with a random key and, unless
// given, a random operator id. A concurrent replica creating it first is
// fine: both then read the same Secret.
func createOwnershipSecret(ctx context.Context, c client.Client, opts SignerOptions) error {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	operatorID := opts.OperatorID
	if operatorID == "" {
		id := make([]byte, 4)
		if _, err := rand.Read(id); err != nil {
			return err
		}
		operatorID = hex.EncodeToString(id)
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: opts.Namespace, Name: opts.Name,
			Labels: map[string]string{hfv1.ManagedByLabel: hfv1.ManagedByValue},
			Annotations: map[string]string{
				"hyperfleet.io/description": "HMAC keys proving which hypervisor VMs this HyperFleet install created. Deleting it orphans every VM of the install.",
			},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{OwnershipKeyField: key, OwnershipOperatorIDField: []byte(operatorID)},
	}
	if err := c.Create(ctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create ownership Secret %s/%s: %w", opts.Namespace, opts.Name, err)
	}
	ctrl.LoggerFrom(ctx).Info("Created a new ownership key", "secret", opts.Namespace+"/"+opts.Name, "operatorId", operatorID)
	return nil
}

// checkNoInstallVMs lists every HypervisorCluster's VMs and fails when one
// carries the tag of the install (hf-<--operator-id>; without
// --operator-id the id is lost with the Secret, so any "hyperfleet" tag
// counts) or when a cluster cannot be listed, unless opts.AllowNewKey.
func checkNoInstallVMs(ctx context.Context, c client.Client, opts SignerOptions) error {
	if opts.AllowNewKey {
		ctrl.LoggerFrom(ctx).Info("Ownership Secret missing; creating a new key without looking for existing VMs ("+AllowNewOwnershipKeyFlag+")",
			"secret", opts.Namespace+"/"+opts.Name)
		return nil
	}
	tag := ownership.TagManaged
	if opts.OperatorID != "" {
		tag = ownership.TagOperatorPrefix + opts.OperatorID
	}
	found, unchecked, err := countTaggedVMs(ctx, c, opts.Factories, tag)
	if err != nil {
		return fmt.Errorf("ownership Secret %s/%s does not exist and the clusters could not be checked for VMs signed with a lost key: %w; restore the Secret, or pass %s to create a new key anyway",
			opts.Namespace, opts.Name, err, AllowNewOwnershipKeyFlag)
	}
	if len(found) == 0 && len(unchecked) == 0 {
		return nil
	}
	var problems []string
	for _, name := range sortedKeys(found) {
		problems = append(problems, fmt.Sprintf("cluster %s has %d VMs tagged %q", name, found[name], tag))
	}
	for _, name := range sortedKeys(unchecked) {
		problems = append(problems, fmt.Sprintf("cluster %s could not be listed (%s)", name, unchecked[name]))
	}
	return fmt.Errorf("ownership Secret %s/%s does not exist, and a new key would make VMs signed with the lost one foreign for good: %s; "+
		"restore the Secret (keys %q, %q) from a backup, or pass %s to create a new key anyway (those VMs must then be removed by hand)",
		opts.Namespace, opts.Name, strings.Join(problems, "; "), OwnershipKeyField, OwnershipOperatorIDField, AllowNewOwnershipKeyFlag)
}

// countTaggedVMs lists the VMs of every HypervisorCluster and counts those
// carrying tag, by cluster; clusters it could not list are returned with
// the reason.
func countTaggedVMs(ctx context.Context, c client.Reader, factories map[hfv1.HypervisorProvider]provider.Factory, tag string) (found map[string]int, unchecked map[string]string, err error) {
	if factories == nil {
		if factories, err = RegisteredFactories(); err != nil {
			return nil, nil, err
		}
	}
	var clusters hfv1.HypervisorClusterList
	if err := c.List(ctx, &clusters); err != nil {
		return nil, nil, fmt.Errorf("list HypervisorClusters: %w", err)
	}
	// Listing needs no valid key: tags are read, never verified. The
	// throwaway signer only satisfies the provider's constructor.
	probeKey := make([]byte, ownership.MinKeyLength)
	if _, err := rand.Read(probeKey); err != nil {
		return nil, nil, err
	}
	lister, err := ownership.NewSigner("existing-vm-check", probeKey)
	if err != nil {
		return nil, nil, err
	}
	found, unchecked = map[string]int{}, map[string]string{}
	for i := range clusters.Items {
		hc := &clusters.Items[i]
		n, err := countClusterTaggedVMs(ctx, c, factories, lister, hc, tag)
		switch {
		case err != nil:
			unchecked[hc.Name] = err.Error()
		case n > 0:
			found[hc.Name] = n
		}
	}
	return found, unchecked, nil
}

func countClusterTaggedVMs(ctx context.Context, c client.Reader, factories map[hfv1.HypervisorProvider]provider.Factory,
	lister *ownership.Signer, hc *hfv1.HypervisorCluster, tag string) (int, error) {
	factory := factories[hc.Spec.Provider]
	if factory == nil {
		return 0, fmt.Errorf("spec.provider: no implementation for %q in this operator build", hc.Spec.Provider)
	}
	cfg, err := clusterconfig.Resolve(ctx, c, hc)
	if err != nil {
		return 0, err
	}
	p, err := factory.New(cfg, provider.Deps{Signer: lister, Log: ctrl.LoggerFrom(ctx).WithName("existing-vm-check")})
	if err != nil {
		return 0, err
	}
	vms, err := p.ListVMs(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, vm := range vms {
		if hasTag(vm.Tags, tag) {
			n++
		}
	}
	return n, nil
}

// hasTag compares case-insensitively, as Proxmox does.
func hasTag(tags []string, want string) bool {
	for _, t := range tags {
		if strings.EqualFold(strings.TrimSpace(t), want) {
			return true
		}
	}
	return false
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
