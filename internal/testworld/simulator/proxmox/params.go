package proxmoxsim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
)

// maxUploadBytes bounds an uploaded file kept in memory. NoCloud ISOs are a
// few hundred KiB; anything near this limit is a test mistake.
const maxUploadBytes = 256 << 20

// uploadedFile is the "filename" part of a multipart upload.
type uploadedFile struct {
	name string
	data []byte
}

// readParams merges query and body parameters the way pve-http-server does:
// form-encoded, JSON (what go-proxmox sends) and multipart bodies are all
// accepted, and every value becomes a string before schema verification.
func readParams(r *http.Request) (map[string]string, *uploadedFile, *apiError) {
	params := map[string]string{}
	for k, v := range r.URL.Query() {
		if len(v) > 0 {
			params[k] = v[len(v)-1]
		}
	}
	if r.Body == nil || r.Method == http.MethodGet || r.Method == http.MethodHead {
		return params, nil, nil
	}
	ct, ctParams, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch ct {
	case "application/json":
		raw, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
		if err != nil {
			return nil, nil, &apiError{code: http.StatusBadRequest, msg: fmt.Sprintf("read request body: %v\n", err)}
		}
		if len(bytes.TrimSpace(raw)) == 0 {
			return params, nil, nil
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var body map[string]any
		if err := dec.Decode(&body); err != nil {
			return nil, nil, &apiError{code: http.StatusBadRequest, msg: fmt.Sprintf("malformed JSON body: %v\n", err)}
		}
		for k, v := range body {
			if s, ok := jsonParamString(v); ok {
				params[k] = s
			}
		}
	case "multipart/form-data":
		f, err := readMultipart(r.Body, ctParams["boundary"], params)
		if err != nil {
			return nil, nil, &apiError{code: http.StatusBadRequest, msg: fmt.Sprintf("malformed multipart body: %v\n", err)}
		}
		return params, f, nil
	default:
		raw, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
		if err != nil {
			return nil, nil, &apiError{code: http.StatusBadRequest, msg: fmt.Sprintf("read request body: %v\n", err)}
		}
		form, err := url.ParseQuery(string(raw))
		if err != nil {
			return nil, nil, &apiError{code: http.StatusBadRequest, msg: fmt.Sprintf("malformed form body: %v\n", err)}
		}
		for k, v := range form {
			if len(v) > 0 {
				params[k] = v[len(v)-1]
			}
		}
	}
	return params, nil, nil
}

// jsonParamString converts a decoded JSON value the way Perl stringifies it:
// JSON true/false become "1"/"0" (so they pass the boolean check), null
// means "not sent".
func jsonParamString(v any) (string, bool) {
	switch t := v.(type) {
	case nil:
		return "", false
	case string:
		return t, true
	case json.Number:
		return t.String(), true
	case bool:
		if t {
			return "1", true
		}
		return "0", true
	default:
		raw, _ := json.Marshal(t)
		return string(raw), true
	}
}

func readMultipart(body io.Reader, boundary string, params map[string]string) (*uploadedFile, error) {
	if boundary == "" {
		return nil, fmt.Errorf("missing boundary")
	}
	mr := multipart.NewReader(body, boundary)
	var file *uploadedFile
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return file, nil
		}
		if err != nil {
			return nil, fmt.Errorf("next part: %w", err)
		}
		data, err := io.ReadAll(io.LimitReader(part, maxUploadBytes+1))
		if err != nil {
			return nil, fmt.Errorf("read part %q: %w", part.FormName(), err)
		}
		if len(data) > maxUploadBytes {
			return nil, fmt.Errorf("part %q exceeds %d bytes", part.FormName(), maxUploadBytes)
		}
		if part.FileName() != "" {
			file = &uploadedFile{name: part.FileName(), data: data}
			// pveproxy stores the file and passes its client-side name
			// as the "filename" parameter.
			params[part.FormName()] = part.FileName()
			continue
		}
		params[part.FormName()] = string(data)
	}
}

type paramKind int

const (
	kString paramKind = iota
	kInt
	kBool
	kNumber
)

// param is one JSON-schema property of an endpoint.
type param struct {
	name     string
	kind     paramKind
	optional bool
	min, max *int64
	maxLen   int
	enum     []string
	// format returns the reason (ending in "\n", as Proxmox's verifiers
	// die) when the value does not have the property's format.
	format  func(string) error
	pattern *regexp.Regexp
	// requires names a parameter that must be sent with this one
	// (JSONSchema's requires, e.g. vm_suspend's statestorage: todisk).
	requires string
}

// schema is the parameter schema of an endpoint.
type schema struct {
	params  map[string]param
	dynamic []dynParam
}

// dynParam covers indexed properties such as net0..net31.
type dynParam struct {
	re *regexp.Regexp
	p  param
}

func sch(ps ...param) *schema {
	s := &schema{params: map[string]param{}}
	for _, p := range ps {
		s.params[p.name] = p
	}
	return s
}

func optional(p param) param { p.optional = true; return p }

func intPtr(v int64) *int64 { return &v }

func (s *schema) lookup(name string) (param, bool) {
	if p, ok := s.params[name]; ok {
		return p, true
	}
	for _, d := range s.dynamic {
		if d.re.MatchString(name) {
			p := d.p
			p.name = name
			return p, true
		}
	}
	return param{}, false
}

// validate returns Proxmox's per-parameter error messages.
func (s *schema) validate(values map[string]string) map[string]string {
	errs := map[string]string{}
	for name, v := range values {
		p, ok := s.lookup(name)
		if !ok {
			errs[name] = "property is not defined in schema and the schema does not allow additional properties"
			continue
		}
		if msg := p.check(v); msg != "" {
			errs[name] = msg
		}
		if _, ok := values[p.requires]; p.requires != "" && !ok {
			// PVE::JSONSchema check_object files it under the missing one.
			errs[p.requires] = fmt.Sprintf("missing property - '%s' requires this property", name)
		}
	}
	for name, p := range s.params {
		if _, ok := values[name]; !ok && !p.optional {
			errs[name] = "property is missing and it is not optional"
		}
	}
	return errs
}

var intRE = regexp.MustCompile(`^-?\d+$`)
var numberRE = regexp.MustCompile(`^-?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$`)

// check mirrors PVE::JSONSchema::check_prop for one value.
func (p param) check(v string) string {
	switch p.kind {
	case kInt:
		if !intRE.MatchString(v) {
			return fmt.Sprintf("type check ('integer') failed - got '%s'", v)
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Sprintf("type check ('integer') failed - got '%s'", v)
		}
		if p.min != nil && n < *p.min {
			return fmt.Sprintf("value must have a minimum value of %d", *p.min)
		}
		if p.max != nil && n > *p.max {
			return fmt.Sprintf("value must have a maximum value of %d", *p.max)
		}
	case kNumber:
		if !numberRE.MatchString(v) {
			return fmt.Sprintf("type check ('number') failed - got '%s'", v)
		}
	case kBool:
		// PVE's check accepts exactly 1 and 0 (JSON true/false arrive as
		// 1/0); "true", "yes" and "on" are rejected.
		if v != "0" && v != "1" {
			return fmt.Sprintf("type check ('boolean') failed - got '%s'", v)
		}
	case kString:
		if p.maxLen > 0 && len(v) > p.maxLen {
			return fmt.Sprintf("value may only be %d characters long", p.maxLen)
		}
		if len(p.enum) > 0 {
			found := false
			for _, e := range p.enum {
				if v == e {
					found = true
				}
			}
			if !found {
				return fmt.Sprintf("value '%s' does not have a value in the enumeration '%s'", v, strings.Join(p.enum, ", "))
			}
		}
		if p.pattern != nil && !p.pattern.MatchString(v) {
			return "value does not match the regex pattern"
		}
		if p.format != nil {
			if err := p.format(v); err != nil {
				return "invalid format - " + err.Error()
			}
		}
	}
	return ""
}

// formatError is a format verifier's reason; like Proxmox's `die "...\n"`
// it keeps the trailing newline, which ends up in the API message.
type formatError string

func (e formatError) Error() string { return string(e) }

func fmtErr(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if !strings.HasSuffix(msg, "\n") {
		msg += "\n"
	}
	return formatError(msg)
}

const (
	minVMID = 100
	maxVMID = 999999999
)

var (
	dnsNameRE   = regexp.MustCompile(`^(?:(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9\-]*[a-zA-Z0-9])\.)*(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9\-]*[A-Za-z0-9])$`)
	storageIDRE = regexp.MustCompile(`^[a-z][a-z0-9\-_.]*[a-z0-9]$`)
	poolIDRE    = regexp.MustCompile(`^[A-Za-z0-9.\-_]+$`)
	userIDRE    = regexp.MustCompile(`^[^\s:/@]+@[A-Za-z][A-Za-z0-9.\-_]+$`)
	tokenNameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9.\-_]+$`)
	upidRE      = regexp.MustCompile(`^UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):([0-9A-Fa-f]{8}):([^:\s]+):([^:\s]*):([^:\s]+):$`)
	sizeRE      = regexp.MustCompile(`^(\+)?(\d+(?:\.\d+)?)([KMGT])?$`)
	configKeyRE = regexp.MustCompile(`^[a-z][a-z_\-]*\d*$`)
)

func verifyDNSName(v string) error {
	if !dnsNameRE.MatchString(v) {
		return fmtErr("value does not look like a valid DNS name")
	}
	return nil
}

func verifyNodeName(v string) error {
	if !dnsNameRE.MatchString(v) || strings.Contains(v, ".") {
		return fmtErr("value does not look like a valid node name")
	}
	return nil
}

func verifyStorageID(v string) error {
	if !storageIDRE.MatchString(v) {
		return fmtErr("storage ID '%s' contains illegal characters", v)
	}
	return nil
}

func verifyPoolID(v string) error {
	if !poolIDRE.MatchString(v) {
		return fmtErr("invalid characters in pool ID")
	}
	return nil
}

// Parameters shared by many endpoints.
var (
	nodeP    = param{name: "node", kind: kString, format: verifyNodeName}
	vmidP    = param{name: "vmid", kind: kInt, min: intPtr(minVMID), max: intPtr(maxVMID)}
	storageP = param{name: "storage", kind: kString, format: verifyStorageID}
	poolIDP  = param{name: "poolid", kind: kString, format: verifyPoolID}
	upidP    = param{name: "upid", kind: kString, maxLen: 256}
	volumeP  = param{name: "volume", kind: kString}
)
