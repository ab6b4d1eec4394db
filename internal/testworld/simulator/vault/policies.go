package vault

// OperatorPolicy is the operator's policy of docs/secrets-store.md: create
// (and update, which check-and-set 0 turns into a conflict) and delete the
// credentials under prefix, and write and delete the VMs' login roles,
// whose parameters are pinned so that the operator cannot give a role any
// other policy, audience or claim.
func OperatorPolicy(kvMount, prefix, authMount, audience, vmPolicy string) []Rule {
	return []Rule{
		{Path: kvMount + "/data/" + prefix + "/*", Capabilities: []string{"create", "update"}},
		{Path: kvMount + "/metadata/" + prefix + "/*", Capabilities: []string{"delete"}},
		{Path: "auth/" + authMount + "/role/*", Capabilities: []string{"create", "update", "delete"},
			AllowedParameters: map[string][]string{
				"role_type":               {"jwt"},
				"user_claim":              {"sub"},
				"bound_subject":           {"spiffe://*"},
				"bound_audiences":         {audience},
				"token_policies":          {vmPolicy},
				"token_no_default_policy": {"true"},
				"token_num_uses":          {"2"},
				"token_ttl":               {},
			}},
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
