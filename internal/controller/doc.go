// Package controller holds HyperFleet's reconcilers, one per kind.
//
// The RBAC markers below are the permissions the manager needs as a whole;
// controller-gen turns them into config/rbac/role.yaml.
package controller

// What each rule is for (docs/security.md, "What the operator can read"):
// the operator never creates or deletes HypervisorClusters, templates, pools
// or IPPools (people do); it adds and removes the HypervisorCluster
// finalizer; it creates, patches and deletes MachineClaims (RunnerPools own
// them, with blockOwnerDeletion, hence runnerpools/finalizers) and CIJobs.
//
// +kubebuilder:rbac:groups=hyperfleet.io,resources=hypervisormachinetemplates;runnerpools;ippools,verbs=get;list;watch
// +kubebuilder:rbac:groups=hyperfleet.io,resources=hypervisorclusters,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=hyperfleet.io,resources=machineclaims;cijobs,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=hyperfleet.io,resources=cijobs,verbs=deletecollection
// +kubebuilder:rbac:groups=hyperfleet.io,resources=hypervisorclusters/status;hypervisormachinetemplates/status;runnerpools/status;machineclaims/status;ippools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=hyperfleet.io,resources=hypervisorclusters/finalizers;runnerpools/finalizers;machineclaims/finalizers,verbs=update
// Secrets: GET reads the referenced ones (uncached); list and watch feed
// only the metadata-only watch that wakes referrers on rotation, whose
// cache keeps namespace and name alone (internal/manager CacheOptions).
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
