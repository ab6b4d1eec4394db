package v1alpha1

import "k8s.io/apimachinery/pkg/api/resource"

// MachineHardware is what a template's VMs get beyond CPU count, memory
// and root disk: a CPU model and flags (KVM inside the job needs the
// virtualization extensions), host devices passed through, and extra
// disks. Every value is checked against the cluster's tenancy rules
// (spec.tenancy[].cpuTypes, cpuFlags, devices, storages) and, by the
// hypervisor kind, against what the hypervisor accepts (docs/templates.md,
// "Hardware").
type MachineHardware struct {
	// cpuType is the VM's CPU model, such as host (the host's CPU, every
	// feature passed through), x86-64-v2-AES or a named model the
	// hypervisor knows (Proxmox VE's cpu types; libvirt: host means
	// host-passthrough, another value a custom model of that name).
	// Unset: the template's own.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9][-_.a-zA-Z0-9]*$`
	CPUType string `json:"cpuType,omitempty"`

	// cpuFlags turn single CPU features on (+aes) or off (-pcid) on top of
	// cpuType. Which flags a hypervisor takes depends on its version (a
	// Proxmox VE 8 VM takes only its short list of VM-specific flags): a
	// flag it does not take leaves the template not Ready with a message
	// naming the flag.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:Pattern=`^[+-][a-z0-9][-_.a-z0-9]*$`
	// +kubebuilder:validation:items:MaxLength=64
	// +listType=set
	CPUFlags []string `json:"cpuFlags,omitempty"`

	// nestedVirtualization exposes the host's virtualization extensions
	// (Intel VT-x or AMD-V) so that jobs run KVM guests: Android
	// emulators, KinD with VMs, Firecracker, nested builds. The hosts must
	// allow nested KVM (kvm_intel or kvm_amd nested=1). Proxmox VE 9 sets
	// the nested-virt flag; on Proxmox VE 8 only cpuType host passes the
	// extensions through, so a template asking for it there must set
	// cpuType host. libvirt: host-passthrough, or the vmx/svm feature
	// required on another model.
	// +optional
	NestedVirtualization bool `json:"nestedVirtualization,omitempty"`

	// devices are host devices passed through to the VM, each one device
	// of a mapping the platform team defines on the hypervisor (a Proxmox
	// VE PCI resource mapping, cluster/mapping/pci; a libvirt cluster's
	// spec.libvirt.devices). A VM is placed on a node with a free device
	// of each mapping it names; no two VMs share a device.
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +listType=atomic
	Devices []DeviceRequest `json:"devices,omitempty"`

	// extraDisks are empty disks added to the VM after its root disk, in
	// order (Proxmox scsi1, scsi2...; libvirt vdb, vdc...): a build cache,
	// a scratch volume. They are destroyed with the VM.
	// +optional
	// +kubebuilder:validation:MaxItems=4
	// +listType=atomic
	ExtraDisks []ExtraDisk `json:"extraDisks,omitempty"`
}

// DeviceRequest asks for one device of a mapping.
type DeviceRequest struct {
	// mapping is the name of the hypervisor-side device mapping (Proxmox
	// VE: the id of a cluster/mapping/pci entry; libvirt: a name in the
	// cluster's spec.libvirt.devices).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[a-zA-Z][-_a-zA-Z0-9]*$`
	Mapping string `json:"mapping"`
}

// ExtraDisk is an empty disk added to a VM.
// +kubebuilder:validation:XValidation:rule="quantity(string(self.size)).compareTo(quantity('1Gi')) >= 0 && quantity(string(self.size)).compareTo(quantity('64Ti')) <= 0",message="hardware.extraDisks[].size must be between 1Gi and 64Ti"
type ExtraDisk struct {
	// size is the disk's size, such as 100Gi.
	// +required
	Size resource.Quantity `json:"size"`

	// storage is where the disk is allocated (a Proxmox storage; libvirt:
	// a storage pool). Unset: the cluster's defaultStorage (libvirt:
	// spec.libvirt.volumePool). It must be one of the tenancy rule's
	// storages.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_][-_.a-zA-Z0-9]*$`
	Storage string `json:"storage,omitempty"`
}

// TenantLimits cap what one namespace may hold on a cluster at once. Each
// namespace a tenancy rule selects gets the whole limit to itself. Usage
// counts every claim of the namespace whose VM is placed on the cluster,
// from its signed placement record (status.placementRecord), until the
// VM is destroyed; a claim over a limit waits (Provisioned=False, reason
// QuotaExceeded) and is placed when usage falls.
type TenantLimits struct {
	// machines is the most VMs at once.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	Machines *int32 `json:"machines,omitempty"`

	// cpu is the most virtual CPU cores at once (resources.cpu summed).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000
	CPU *int32 `json:"cpu,omitempty"`

	// memory is the most memory at once (resources.memory summed), such
	// as 256Gi.
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`

	// disk is the most disk at once: each VM's root disk as placed
	// (resources.disk; a template that keeps its own size counts as 0)
	// and its extra disks.
	// +optional
	Disk *resource.Quantity `json:"disk,omitempty"`

	// devices is the most passed-through devices at once
	// (hardware.devices summed).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	Devices *int32 `json:"devices,omitempty"`
}
