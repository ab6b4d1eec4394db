package cloudinit

import (
	"errors"
	"strings"
	"testing"
	"text/template"
)

func TestTemplateErrors(t *testing.T) {
	v := baseVars()
	for _, tc := range []struct {
		name, field, text string
		want              []string
	}{
		{"unknown variable", FieldUserData, "#cloud-config\n\nhostname_note: {{ .HostName }}\n",
			[]string{"spec.cloudInit.userData line 3:", "unknown variable .HostName; did you mean .Hostname?"}},
		{"the join token", FieldUserData, "#cloud-config\nwrite_files: [{path: /t, content: \"{{ .JoinToken }}\"}]\n",
			[]string{"line 2", "unknown variable .JoinToken: the SPIRE join token is never rendered into cloud-init", "docs/identity.md"}},
		{"the JIT configuration", FieldUserData, "#cloud-config\nruncmd: [[run.sh, --jitconfig, \"{{ .JITConfig }}\"]]\n",
			[]string{"line 2", "unknown variable .JITConfig: the runner credential is never rendered into cloud-init", "used before the VM runs", "/run/hyperfleet/secrets.json"}},
		{"the registration token", FieldUserData, "#cloud-config\nwrite_files: [{path: /t, content: \"{{ .RunnerToken }}\"}]\n",
			[]string{"line 2", "unknown variable .RunnerToken: the runner credential is never rendered into cloud-init", "Nothing replayable at rest"}},
		{"unknown runner field", FieldUserData, "#cloud-config\na: {{ .RunnerConfig.Url }}\n",
			[]string{"line 2", "unknown variable .RunnerConfig.Url", ".DownloadURL"}},
		{"field inside range", FieldUserData, "#cloud-config\n{{ range .Labels }}\n{{ .Hostname }}\n{{ end }}\n",
			[]string{"line 3", "$.Hostname"}},
		{"unknown function", FieldNetworkData, "version: 2\n{{ toJSON .Labels }}\n",
			[]string{"spec.cloudInit.networkData line 2:", `unknown function "toJSON"; did you mean toJson?`}},
		{"syntax", FieldMetaData, "a: 1\nb: {{ .Hostname \n",
			[]string{"spec.cloudInit.metaData line 3:", "unclosed action started at line 2"}},
		{"define", FieldUserData, "{{ define \"x\" }}y{{ end }}#cloud-config\n",
			[]string{"{{ define }} and {{ block }} are not supported"}},
		{"template call", FieldUserData, "#cloud-config\n\n{{ template \"x\" }}\n",
			[]string{"line 3", "{{ template \"x\" }} is not supported"}},
		{"range over literal", FieldUserData, "#cloud-config\n{{ range 100000000 }}x{{ end }}\n",
			[]string{"line 2", "range may only walk a variable's list"}},
		{"range over variable", FieldUserData, "#cloud-config\n{{ $n := 9 }}{{ range $n }}x{{ end }}\n",
			[]string{"range may only walk"}},
		{"nested ranges", FieldUserData, "#cloud-config\n{{ range .Labels }}{{ range $.Labels }}{{ range $.Labels }}{{ range $.Labels }}{{ end }}{{ end }}{{ end }}{{ end }}\n",
			[]string{"nested more than 3 deep"}},
		{"printf width", FieldUserData, "#cloud-config\na: {{ printf \"%0999999999d\" 1 }}\n",
			[]string{"widths and precisions above 256"}},
		{"printf star", FieldUserData, "#cloud-config\na: {{ printf \"%*d\" 5 1 }}\n",
			[]string{"'*' widths are not allowed"}},
		{"indent", FieldUserData, "#cloud-config\na: {{ indent 100000 .Hostname }}\n",
			[]string{"indent takes 0 to 64 spaces"}},
		{"binary range", FieldUserData, "#cloud-config\n{{ range .BootstrapServiceBinary }}x{{ end }}\n",
			[]string{"line 2", "range can't iterate"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := execute(tc.field, tc.text, v)
			if err == nil {
				t.Fatal("execute succeeded, want an error")
			}
			var e *Error
			if !errors.As(err, &e) || e.Field != tc.field {
				t.Errorf("error %v is not an *Error for %s", err, tc.field)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestTemplateErrorsWrapTheirCause(t *testing.T) {
	_, err := execute(FieldUserData, "{{ .Nope }}", baseVars())
	var ee template.ExecError
	if !errors.As(err, &ee) {
		t.Errorf("%v does not wrap text/template's ExecError", err)
	}
	_, err = Render(Input{Vars: baseVars(), UserData: "#cloud-config\na: [1\n"})
	if err == nil || errors.Unwrap(errors.Unwrap(err)) == nil || strings.Count(err.Error(), "did not find expected") != 1 {
		t.Errorf("YAML error %v should wrap the parser's error once", err)
	}
}

func TestTemplateOutputLimit(t *testing.T) {
	v := baseVars()
	v.Labels = make(List, 40)
	for i := range v.Labels {
		v.Labels[i] = strings.Repeat("x", 60)
	}
	// 40^3 iterations of 5 KiB: far beyond the limit.
	body := strings.Repeat("{{ $.RunnerName }}{{ $.InstanceID }}{{ $.FQDN }}", 50)
	text := "#cloud-config\n{{ range .Labels }}{{ range $.Labels }}{{ range $.Labels }}" + body + "{{ end }}{{ end }}{{ end }}\n"
	_, err := execute(FieldUserData, text, v)
	if err == nil || !strings.Contains(err.Error(), "rendered output is larger than") {
		t.Fatalf("want the output limit, got %v", err)
	}
}

func TestTemplateFunctionsAndVariables(t *testing.T) {
	v := runnerTokenVars(baseVars())
	v.BootstrapServiceBinary = NewBytes([]byte{0, 1, 2, 255})
	for _, tc := range []struct{ text, want string }{
		{"{{ .DNSServers }}", `["192.0.2.53"]`},
		{"{{ .Labels }}", `["self-hosted","hyperfleet","linux"]`},
		{"{{ toJson .Labels }}", `["self-hosted","hyperfleet","linux"]`},
		{"{{ .Labels | toJson }}", `["self-hosted","hyperfleet","linux"]`},
		{"{{ toYaml .Labels | indent 2 }}", "  - self-hosted\n  - hyperfleet\n  - linux"},
		{"{{ join .Labels \",\" }}", "self-hosted,hyperfleet,linux"},
		{"{{ quote \"a \\\"b\\\" <c>\" }}", `"a \"b\" <c>"`},
		{"{{ .Hostname | base64 }}", "cnVubmVyLWFiYzEy"},
		{"{{ .BootstrapServiceBinary | base64 }}", "AAEC/w=="},
		{"{{ .BootstrapServiceBinary }}", "<4 bytes; use base64>"},
		{"{{ .SecretsDeadline }}", "2025-06-01T12:30:00Z"},
		{"{{ .RunnerConfig.DownloadUrl }}", v.RunnerConfig.DownloadURL},
		{"{{ upper .RunnerConfig.OS }}-{{ lower \"X64\" }}", "LINUX-x64"},
		{"{{ default \"none\" .RunnerGroup }} {{ default \"none\" .SPIFFEID }}", "ci-runners none"},
		{"{{ if eq .BootstrapMethod \"runner-token\" }}token{{ end }}", "token"},
		{"{{ range $i, $d := .SearchDomains }}{{ $i }}={{ $d }}{{ end }}", "0=ci.example.com"},
		{"{{ printf \"%-5s|\" .RunnerConfig.Arch }}", "x64  |"},
		{"{{ len .Labels }} {{ index .Labels 1 }}", "3 hyperfleet"},
	} {
		out, err := execute(FieldUserData, tc.text, v)
		if err != nil {
			t.Errorf("%s: %v", tc.text, err)
			continue
		}
		if string(out) != tc.want {
			t.Errorf("%s = %q, want %q", tc.text, out, tc.want)
		}
	}
	// Zero time and empty lists print as nothing and [].
	c := v.Canonical()
	out, err := execute(FieldUserData, "{{ .SecretsDeadline }}|{{ .Labels }}", c)
	if err != nil || string(out) != "|[]" {
		t.Errorf("canonical SecretsDeadline and Labels print %q (%v), want \"|[]\"", out, err)
	}
}

func TestNetworkAndMetaDataErrors(t *testing.T) {
	ci := baseVars()
	ci.NetworkMode = NetworkCloudInit
	for _, tc := range []struct {
		name string
		in   Input
		want []string
	}{
		{"networkData in dhcp mode", Input{Vars: baseVars(), NetworkData: "version: 2\n"}, []string{FieldNetworkData, "used only with spec.network.mode cloud-init"}},
		{"cloud-init without networkData", Input{Vars: ci}, []string{FieldNetworkData, "is empty"}},
		{"no version", Input{Vars: ci, NetworkData: "ethernets: {}\n"}, []string{"has no version key"}},
		{"bad version", Input{Vars: ci, NetworkData: "version: 3\n"}, []string{"line 1", `version is "3"`}},
		{"not a mapping", Input{Vars: ci, NetworkData: "- a\n"}, []string{"must render to a YAML mapping"}},
		{"two docs", Input{Vars: ci, NetworkData: "version: 2\n---\nversion: 2\n"}, []string{"more than one YAML document"}},
		{"wrapped bad", Input{Vars: ci, NetworkData: "network: [1]\n"}, []string{"network must be a mapping"}},
		{"instance-id", Input{Vars: baseVars(), MetaData: "zone: a\ninstance-id: mine\n"}, []string{FieldMetaData, "line 2", `"instance-id" is set by HyperFleet`}},
		{"meta not mapping", Input{Vars: baseVars(), MetaData: "just text\n"}, []string{FieldMetaData, "must be a YAML mapping"}},
		{"unhashable key", Input{Vars: baseVars(), MetaData: "? [a]\n: b\n"}, []string{"used as a mapping key"}},
		{"plain equals", Input{Vars: baseVars(), UserData: "#cloud-config\nx: =\n"}, []string{"YAML 1.1's value key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Render(tc.in)
			if err == nil {
				t.Fatal("Render succeeded, want an error")
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Errorf("error %v is not an *Error", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}

	// A network key wrapper is accepted, as cloud-init accepts it.
	if _, err := Render(Input{Vars: ci, NetworkData: "network:\n  version: 2\n  ethernets: {}\n"}); err != nil {
		t.Errorf("network: wrapper rejected: %v", err)
	}
}

func TestScriptLeadingBlankLines(t *testing.T) {
	out, err := Render(Input{Vars: baseVars(), UserData: "{{/* comment */}}\n\n#!/bin/sh\necho hi\n"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out.UserData), "filename=\"user-data\"\n\n#!/bin/sh\n") {
		t.Errorf("the script does not start with #! in its part:\n%s", out.UserData)
	}
	_, err = Render(Input{Vars: baseVars(), UserData: "\n\nhello\n"})
	if err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("unknown user data on line 3: %v", err)
	}
}

func TestNetworkWithoutMAC(t *testing.T) {
	v := baseVars()
	v.MACAddress = ""
	out, err := Render(Input{Vars: v})
	if err != nil {
		t.Fatal(err)
	}
	s := string(out.NetworkConfig)
	if strings.Contains(s, "match:") || strings.Contains(s, "set-name") || !strings.Contains(s, "  eth0:\n") {
		t.Errorf("without a MAC the config should name eth0 without match/set-name:\n%s", s)
	}
	v.SendHostname = false
	out, err = Render(Input{Vars: v})
	if err != nil {
		t.Fatal(err)
	}
	if s := string(out.NetworkConfig); !strings.Contains(s, "send-hostname: false") || strings.Contains(s, "hostname: runner") {
		t.Errorf("SendHostname false still sends the hostname:\n%s", s)
	}
}

func FuzzTemplate(f *testing.F) {
	for _, s := range []string{seedUserData, mergeUserData, "{{ .Hostname }}", "{{ range .Labels }}{{ . }}{{ end }}", "{{ template \"x\" }}", "{{ printf \"%5d\" 1 }}"} {
		f.Add(s)
	}
	v := runnerTokenVars(baseVars())
	f.Fuzz(func(t *testing.T, text string) {
		if len(text) > 4096 {
			return
		}
		out, err := execute(FieldUserData, text, v)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Field != FieldUserData {
				t.Fatalf("error is not an *Error about %s: %v", FieldUserData, err)
			}
			return
		}
		if len(out) > maxOutput {
			t.Fatalf("output of %d bytes passed the limit", len(out))
		}
	})
}
