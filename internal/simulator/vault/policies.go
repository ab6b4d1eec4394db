package vault

// OperatorPolicy is the operator's policy of docs/secrets-store.md: create
// (and update, which check-and-set 0 turns into a conflict) and delete the
// credentials under prefix, and write and delete the VMs' login roles.
func OperatorPolicy(kvMount, prefix, authMount string) []Rule {
	return []Rule{
		{Path: kvMount + "/data/" + prefix + "/*", Capabilities: []string{"create", "update"}},
		{Path: kvMount + "/metadata/" + prefix + "/*", Capabilities: []string{"delete"}},
		{Path: "auth/" + authMount + "/role/*", Capabilities: []string{"create", "update", "delete"}},
	}
}

// VMPolicy is the VMs' templated policy of docs/secrets-store.md: a login
// token may read and delete only the credential whose last segment (the
// VM's UID) is the name of the role it logged in with, which the JWT auth
// method records in the entity alias's metadata.
func VMPolicy(kvMount, prefix, authAccessor string) []Rule {
	self := "/+/vm/+/+/{{identity.entity.aliases." + authAccessor + ".metadata.role}}"
	return []Rule{
		{Path: kvMount + "/data/" + prefix + self, Capabilities: []string{"read"}},
		{Path: kvMount + "/metadata/" + prefix + self, Capabilities: []string{"delete"}},
	}
}
