package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// GetConditions and SetConditions give the patch helper (internal/patch)
// one way to reach every kind's conditions.

// GetConditions returns the cluster's conditions.
func (c *HypervisorCluster) GetConditions() []metav1.Condition { return c.Status.Conditions }

// SetConditions replaces the cluster's conditions.
func (c *HypervisorCluster) SetConditions(v []metav1.Condition) { c.Status.Conditions = v }

// GetConditions returns the template's conditions.
func (t *HypervisorMachineTemplate) GetConditions() []metav1.Condition { return t.Status.Conditions }

// SetConditions replaces the template's conditions.
func (t *HypervisorMachineTemplate) SetConditions(v []metav1.Condition) { t.Status.Conditions = v }

// GetConditions returns the pool's conditions.
func (p *RunnerPool) GetConditions() []metav1.Condition { return p.Status.Conditions }

// SetConditions replaces the pool's conditions.
func (p *RunnerPool) SetConditions(v []metav1.Condition) { p.Status.Conditions = v }

// GetConditions returns the claim's conditions.
func (c *MachineClaim) GetConditions() []metav1.Condition { return c.Status.Conditions }

// SetConditions replaces the claim's conditions.
func (c *MachineClaim) SetConditions(v []metav1.Condition) { c.Status.Conditions = v }

// GetConditions returns the IP pool's conditions.
func (p *IPPool) GetConditions() []metav1.Condition { return p.Status.Conditions }

// SetConditions replaces the IP pool's conditions.
func (p *IPPool) SetConditions(v []metav1.Condition) { p.Status.Conditions = v }
