// Package v1alpha1 contains the HyperFleet API: HypervisorCluster,
// HypervisorMachineTemplate, RunnerPool, MachineClaim and IPPool.
// +kubebuilder:object:generate=true
// +groupName=hyperfleet.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every HyperFleet kind.
	GroupVersion = schema.GroupVersion{Group: "hyperfleet.io", Version: "v1alpha1"}

	// SchemeBuilder registers the HyperFleet kinds with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the HyperFleet kinds to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
