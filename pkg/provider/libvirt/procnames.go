package libvirt

import "strconv"

// remoteProcedures names the procedures of libvirt's remote protocol
// (REMOTE_PROC_* of remote_protocol.x; go-libvirt keeps its table
// internal) that this provider calls, for the hypervisor API metrics'
// endpoint label. Another procedure is labelled by its number.
var remoteProcedures = map[uint32]string{
	1: "ConnectOpen", 2: "ConnectClose", 6: "NodeGetInfo", 9: "DomainCreate", 11: "DomainDefineXML",
	12: "DomainDestroy", 14: "DomainGetXMLDesc", 23: "DomainLookupByName", 60: "ConnectSupportsFeature",
	66: "AuthList", 78: "StoragePoolCreate", 80: "StoragePoolDestroy", 83: "StoragePoolRefresh",
	84: "StoragePoolLookupByName", 87: "StoragePoolGetInfo", 93: "StorageVolCreateXML", 94: "StorageVolDelete",
	95: "StorageVolLookupByName", 97: "StorageVolLookupByPath", 98: "StorageVolGetInfo", 99: "StorageVolGetXMLDesc",
	102: "NodeGetFreeMemory", 125: "StorageVolCreateXMLFrom", 157: "ConnectGetLibVersion",
	161: "DomainDetachDeviceFlags", 174: "DomainUpdateDeviceFlags", 182: "DomainManagedSave", 183: "DomainHasManagedSaveImage",
	184: "DomainManagedSaveRemove", 196: "DomainCreateWithFlags", 208: "StorageVolUpload", 212: "DomainGetState",
	228: "NodeGetMemoryStats", 231: "DomainUndefineFlags", 234: "DomainDestroyFlags", 258: "DomainShutdownFlags",
	264: "DomainSetMetadata", 273: "ConnectListAllDomains", 282: "StoragePoolListAllVolumes",
	316: "ConnectDomainEventCallbackRegisterAny", 317: "ConnectDomainEventCallbackDeregisterAny",
	350: "DomainDefineXMLFlags", 353: "DomainInterfaceAddresses", 388: "DomainManagedSaveGetXMLDesc", 389: "DomainManagedSaveDefineXML",
}

// qemuProcedures names the procedures of libvirt's QEMU protocol
// (QEMU_PROC_* of qemu_protocol.x) that this provider calls.
var qemuProcedures = map[uint32]string{3: "DomainAgentCommand"}

// qemuProgram is libvirt's QEMU_PROGRAM.
const qemuProgram = 0x20008087

// callName is the method and endpoint labels of a call: the protocol
// ("remote" or "qemu") and the procedure's name.
func callName(program, procedure uint32) (method, endpoint string) {
	names, method := remoteProcedures, "remote"
	if program == qemuProgram {
		names, method = qemuProcedures, "qemu"
	}
	if name, ok := names[procedure]; ok {
		return method, name
	}
	return method, "proc" + strconv.FormatUint(uint64(procedure), 10)
}
