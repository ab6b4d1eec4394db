// Package controller holds HyperFleet's reconcilers, one per kind, each in
// the same skeleton (docs/architecture.md, "One skeleton for every
// reconciler"): <kind>_controller.go has the setup, the watches, Reconcile
// and the scope's open and close, and <kind>_phases.go the phases (the
// RunnerPool's are split by concern: runnerpool_claims.go, _scopecheck.go,
// _backoff.go, _lifecycle.go, _scaling.go, _status.go). Around them: the
// scopes' shared parts (scope.go), the in-use finalizers (inuse.go) and the
// RunnerPool resync (runnerpool_resync.go). The MachineClaim's reconciler,
// phases, status and services are the package machineclaim below this one;
// the field indexes (fieldindex) and refusals (refusal) are small packages
// of their own because both this package and machineclaim use them.
//
// The RBAC markers below are the permissions the manager needs as a whole;
// controller-gen turns them into config/rbac/role.yaml.
package controller

// What each rule is for (docs/security.md, "What the operator can read"):
// the operator never creates or deletes HypervisorClusters, templates, pools
// or IPPools (people do); it adds and removes the in-use finalizers of
// HypervisorClusters, templates and IPPools (update, patch; inuse.go); it creates, patches and deletes MachineClaims (RunnerPools own
// them, with blockOwnerDeletion, hence runnerpools/finalizers) and CIJobs,
// finished claims by collection (machineclaim/finished.go).
//
// +kubebuilder:rbac:groups=hyperfleet.io,resources=runnerpools,verbs=get;list;watch
// +kubebuilder:rbac:groups=hyperfleet.io,resources=hypervisorclusters;hypervisormachinetemplates;ippools,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=hyperfleet.io,resources=machineclaims;cijobs,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=hyperfleet.io,resources=machineclaims;cijobs,verbs=deletecollection
// +kubebuilder:rbac:groups=hyperfleet.io,resources=hypervisorclusters/status;hypervisormachinetemplates/status;runnerpools/status;machineclaims/status;ippools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=hyperfleet.io,resources=hypervisorclusters/finalizers;hypervisormachinetemplates/finalizers;ippools/finalizers;runnerpools/finalizers;machineclaims/finalizers,verbs=update
// Secrets are not in this role: the ClusterRole hyperfleet-secret-reader
// (config/rbac/secret_reader_role.yaml) holds get, list and watch on them
// and is bound only in the namespaces of --secret-namespaces, those whose
// Secrets HyperFleet objects reference (docs/security.md).
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// The DNSEndpoints of clusters whose dns.dnsProvider is served through
// external-dns (internal/dnsreg/externaldns): one per registered VM, in the
// namespace the cluster names; listed in every namespace to find a name's
// other records before taking it. Harmless where external-dns's CRD is
// not installed.
// +kubebuilder:rbac:groups=externaldns.k8s.io,resources=dnsendpoints,verbs=get;list;create;update;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
