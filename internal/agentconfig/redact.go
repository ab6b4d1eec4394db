package agentconfig

import "strings"

// minSecretFragment is the shortest piece of a secret that is redacted on
// its own: messages quote truncated values ("starts with %q" shows 40
// characters), so a prefix or any other long enough piece of a credential
// is as much a leak as the whole.
const minSecretFragment = 8

// Redacted replaces what a message shows of a secret.
const Redacted = "[redacted]"

// RedactSecrets returns msg with every occurrence of a secret, and of every
// piece of one at least minSecretFragment bytes long, replaced by
// Redacted. Secrets shorter than that are replaced only whole.
func RedactSecrets(msg string, secrets ...string) string {
	covered := make([]bool, len(msg))
	found := false
	mark := func(from, n int) {
		for i := from; i < from+n; i++ {
			covered[i] = true
		}
		found = true
	}
	for _, s := range secrets {
		switch {
		case s == "":
			continue
		case len(s) < minSecretFragment:
			for from := 0; ; {
				i := strings.Index(msg[from:], s)
				if i < 0 {
					break
				}
				mark(from+i, len(s))
				from += i + 1
			}
			continue
		}
		fragments := make(map[string]struct{}, len(s))
		for i := 0; i+minSecretFragment <= len(s); i++ {
			fragments[s[i:i+minSecretFragment]] = struct{}{}
		}
		for i := 0; i+minSecretFragment <= len(msg); i++ {
			if _, ok := fragments[msg[i:i+minSecretFragment]]; ok {
				mark(i, minSecretFragment)
			}
		}
	}
	if !found {
		return msg
	}
	var b strings.Builder
	for i := 0; i < len(msg); {
		if !covered[i] {
			b.WriteByte(msg[i])
			i++
			continue
		}
		b.WriteString(Redacted)
		for i < len(msg) && covered[i] {
			i++
		}
	}
	return b.String()
}

// secrets are c's credential values.
func (c *Config) secrets() []string {
	out := []string{c.JITConfig, c.RegistrationToken}
	if c.SPIFFE != nil {
		out = append(out, c.SPIFFE.JoinToken)
	}
	if c.PowerOffNotify != nil {
		out = append(out, c.PowerOffNotify.Token)
	}
	return out
}
