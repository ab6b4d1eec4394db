package vault

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// kvMount is a KV version 2 secrets engine.
type kvMount struct {
	secrets map[string]*kvSecret
}

// kvSecret is one key's metadata and versions.
type kvSecret struct {
	current  int
	versions map[int]*kvVersion
}

type kvVersion struct {
	data    map[string]any
	created time.Time
}

// EnableKV mounts a KV version 2 secrets engine at mount (such as secret).
func (s *Server) EnableKV(mount string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kv[mount] = &kvMount{secrets: map[string]*kvSecret{}}
}

// Secret returns the data of the current version of the secret at p in
// mount and its version number; ok is false when there is none.
func (s *Server) Secret(mount, p string) (data map[string]any, version int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.kv[mount]
	if m == nil || m.secrets[p] == nil {
		return nil, 0, false
	}
	sec := m.secrets[p]
	return sec.versions[sec.current].data, sec.current, true
}

// SecretPaths lists the paths in mount that hold a secret.
func (s *Server) SecretPaths(mount string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	if m := s.kv[mount]; m != nil {
		for p := range m.secrets {
			out = append(out, p)
		}
	}
	return out
}

func (s *Server) kvMountFor(path string) (*kvMount, string, bool) {
	for name, m := range s.kv {
		if rest, ok := strings.CutPrefix(path, name+"/"); ok {
			return m, rest, true
		}
	}
	return nil, "", false
}

func (s *Server) kvData(w http.ResponseWriter, r *http.Request, full string, m *kvMount, p string) {
	switch r.Method {
	case http.MethodGet:
		if _, ok := s.authorize(w, r, full, "read", nil); !ok {
			return
		}
		sec := m.secrets[p]
		if sec == nil {
			// A read of nothing is a 404 with no error message.
			respondError(w, http.StatusNotFound, "")
			return
		}
		v := sec.versions[sec.current]
		respondData(w, map[string]any{"data": v.data, "metadata": versionMetadata(sec.current, v)}, nil)
	case http.MethodPut, http.MethodPost:
		// The existence check makes a write to a new key a create and to
		// an existing one an update, each its own capability.
		capability := "update"
		if m.secrets[p] == nil {
			capability = "create"
		}
		body, ok := readBody(w, r)
		if !ok {
			return
		}
		if _, ok := s.authorize(w, r, full, capability, body); !ok {
			return
		}
		s.kvWrite(w, m, p, body)
	default:
		respondError(w, http.StatusMethodNotAllowed, "unsupported operation")
	}
}

// kvWrite is the KV version 2 data write: options.cas 0 writes only a key
// that does not exist, n only over current version n.
func (s *Server) kvWrite(w http.ResponseWriter, m *kvMount, p string, body map[string]any) {
	data, ok := body["data"].(map[string]any)
	if !ok {
		respondError(w, http.StatusBadRequest, "no data provided")
		return
	}
	sec := m.secrets[p]
	current := 0
	if sec != nil {
		current = sec.current
	}
	if options, ok := body["options"].(map[string]any); ok {
		if raw, ok := options["cas"]; ok {
			cas, err := strconv.Atoi(strings.TrimSpace(jsonString(raw)))
			if err != nil {
				respondError(w, http.StatusBadRequest, "error parsing check-and-set parameter")
				return
			}
			if cas != current {
				respondError(w, http.StatusBadRequest, "check-and-set parameter did not match the current version")
				return
			}
		}
	}
	if sec == nil {
		sec = &kvSecret{versions: map[int]*kvVersion{}}
		m.secrets[p] = sec
	}
	sec.current++
	v := &kvVersion{data: normalize(data), created: s.now().UTC()}
	sec.versions[sec.current] = v
	respondData(w, versionMetadata(sec.current, v), nil)
}

func (s *Server) kvMetadata(w http.ResponseWriter, r *http.Request, full string, m *kvMount, p string) {
	if r.Method != http.MethodDelete {
		respondError(w, http.StatusMethodNotAllowed, "unsupported operation")
		return
	}
	if _, ok := s.authorize(w, r, full, "delete", nil); !ok {
		return
	}
	// Deleting the metadata removes every version; a key that does not
	// exist is no error.
	delete(m.secrets, p)
	w.WriteHeader(http.StatusNoContent)
}

func versionMetadata(version int, v *kvVersion) map[string]any {
	return map[string]any{
		"version":         version,
		"created_time":    v.created.Format(time.RFC3339Nano),
		"deletion_time":   "",
		"destroyed":       false,
		"custom_metadata": nil,
	}
}

// jsonString is a decoded JSON scalar as text.
func jsonString(v any) string {
	switch v := v.(type) {
	case json.Number:
		return v.String()
	case string:
		return v
	case bool:
		return strconv.FormatBool(v)
	}
	return "not a number"
}

// normalize turns the json.Numbers of a decoded body back into the numbers
// a stored secret returns.
func normalize(data map[string]any) map[string]any {
	b, _ := json.Marshal(data)
	out := map[string]any{}
	_ = json.Unmarshal(b, &out)
	return out
}
