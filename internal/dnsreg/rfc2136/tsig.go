package rfc2136

import (
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/miekg/dns"

	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
)

// TSIGKey is a shared TSIG key (RFC 8945): its name, its HMAC algorithm
// and its secret, as configured on the server.
type TSIGKey struct {
	// Name is the key's name, such as hyperfleet-update (the trailing dot
	// is optional).
	Name string
	// Algorithm is the HMAC algorithm by its TSIG name: hmac-sha1,
	// hmac-sha224, hmac-sha256 (the default when empty), hmac-sha384 or
	// hmac-sha512.
	Algorithm string
	// Secret is the key in base64, as tsig-keygen and keymgr print it.
	Secret string
}

// algorithms are the HMACs miekg/dns signs with, by TSIG name without the
// trailing dot. HMAC-MD5 is left out: miekg/dns no longer implements it and
// RFC 8945 marks it deprecated.
var algorithms = map[string]string{
	"hmac-sha1":   dns.HmacSHA1,
	"hmac-sha224": dns.HmacSHA224,
	"hmac-sha256": dns.HmacSHA256,
	"hmac-sha384": dns.HmacSHA384,
	"hmac-sha512": dns.HmacSHA512,
}

// normalize checks k and returns it with its name and algorithm as fully
// qualified lower-case names, the form TSIG signs with.
func (k TSIGKey) normalize() (TSIGKey, error) {
	name := strings.ToLower(strings.TrimSuffix(k.Name, "."))
	if name == "" {
		return TSIGKey{}, fmt.Errorf("%w: TSIG key name is empty", dnsreg.ErrInvalid)
	}
	if err := dnsreg.CheckName(name); err != nil {
		return TSIGKey{}, fmt.Errorf("TSIG key name: %w", err)
	}
	alg := strings.ToLower(strings.TrimSuffix(k.Algorithm, "."))
	if alg == "" {
		alg = "hmac-sha256"
	}
	fq, ok := algorithms[alg]
	if !ok {
		return TSIGKey{}, fmt.Errorf("%w: TSIG algorithm %q is not supported (use hmac-sha256, hmac-sha384, hmac-sha512, hmac-sha224 or hmac-sha1)", dnsreg.ErrInvalid, k.Algorithm)
	}
	raw, err := base64.StdEncoding.DecodeString(k.Secret)
	if err != nil || len(raw) == 0 {
		return TSIGKey{}, fmt.Errorf("%w: TSIG secret of key %s is not base64", dnsreg.ErrInvalid, name)
	}
	return TSIGKey{Name: name + ".", Algorithm: fq, Secret: base64.StdEncoding.EncodeToString(raw)}, nil
}

// ParseTSIGKey reads a TSIG key from the value of a Secret key (the
// tsigKey credential). Two forms are accepted, so that the output of the
// usual tools can be stored as it is:
//
//   - nsupdate -y's "[algorithm:]name:secret", such as
//     "hmac-sha256:hyperfleet-update:c2VjcmV0";
//   - a BIND key clause, as tsig-keygen prints it:
//     key "hyperfleet-update" { algorithm hmac-sha256; secret "c2VjcmV0"; };
//
// Surrounding white space and # comments are ignored (not //, which a
// base64 secret may contain). The key is
// checked (a supported algorithm, a base64 secret, a domain name).
func ParseTSIGKey(s string) (TSIGKey, error) {
	s = strings.TrimSpace(stripComments(s))
	var k TSIGKey
	var err error
	if strings.HasPrefix(s, "key") && strings.Contains(s, "{") {
		k, err = parseKeyClause(s)
	} else {
		k, err = parseColonForm(s)
	}
	if err != nil {
		return TSIGKey{}, err
	}
	return k.normalize()
}

// parseColonForm reads "[algorithm:]name:secret". A base64 secret holds no
// colon, so the last colon ends the name.
func parseColonForm(s string) (TSIGKey, error) {
	parts := strings.Split(s, ":")
	switch len(parts) {
	case 2:
		return TSIGKey{Name: parts[0], Secret: parts[1]}, nil
	case 3:
		return TSIGKey{Algorithm: parts[0], Name: parts[1], Secret: parts[2]}, nil
	}
	return TSIGKey{}, fmt.Errorf("%w: TSIG key is neither [algorithm:]name:secret nor a key clause", dnsreg.ErrInvalid)
}

// parseKeyClause reads `key "name" { algorithm a; secret "s"; };`.
func parseKeyClause(s string) (TSIGKey, error) {
	bad := fmt.Errorf("%w: TSIG key clause is not key \"name\" { algorithm ...; secret \"...\"; };", dnsreg.ErrInvalid)
	rest := strings.TrimSpace(strings.TrimPrefix(s, "key"))
	open := strings.IndexByte(rest, '{')
	end := strings.LastIndexByte(rest, '}')
	if open < 0 || end < open || strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest[end+1:]), ";")) != "" {
		return TSIGKey{}, bad
	}
	var k TSIGKey
	k.Name = unquote(strings.TrimSpace(rest[:open]))
	for stmt := range strings.SplitSeq(rest[open+1:end], ";") {
		fields := strings.Fields(stmt)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return TSIGKey{}, bad
		}
		switch fields[0] {
		case "algorithm":
			k.Algorithm = unquote(fields[1])
		case "secret":
			k.Secret = unquote(fields[1])
		default:
			return TSIGKey{}, bad
		}
	}
	return k, nil
}

func unquote(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return s[1 : len(s)-1]
	}
	return s
}

// stripComments drops # comments to the end of their line.
func stripComments(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if j := strings.Index(l, "#"); j >= 0 {
			l = l[:j]
		}
		lines[i] = l
	}
	return strings.Join(lines, "\n")
}
