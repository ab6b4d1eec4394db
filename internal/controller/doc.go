// Package controller holds HyperFleet's reconcilers, one per kind.
//
// The RBAC markers below are the permissions the manager needs as a whole;
// controller-gen turns them into config/rbac/role.yaml.
package controller

// +kubebuilder:rbac:groups=hyperfleet.io,resources=hypervisorclusters;hypervisormachinetemplates;runnerpools;machineclaims;ippools;cijobs,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=hyperfleet.io,resources=cijobs,verbs=deletecollection
// +kubebuilder:rbac:groups=hyperfleet.io,resources=hypervisorclusters/status;hypervisormachinetemplates/status;runnerpools/status;machineclaims/status;ippools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=hyperfleet.io,resources=hypervisorclusters/finalizers;hypervisormachinetemplates/finalizers;runnerpools/finalizers;machineclaims/finalizers;ippools/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
