package main

import (
	"flag"
	"io"
	"strings"
	"testing"
)

func TestAgentServerFlags(t *testing.T) {
	full := []string{"--agent-server-addr=:9443", "--agent-server-url=https://agents.example.com:9443",
		"--agent-server-cert=/tls/tls.crt", "--agent-server-key=/tls/tls.key", "--agent-binaries-dir=/agents"}
	cases := []struct {
		name string
		args []string
		want string // error text; "" for success
		on   bool
	}{
		{name: "off", args: nil},
		{name: "complete", args: full, on: true},
		{name: "complete with CA", args: append(full[:len(full):len(full)], "--agent-server-ca=/tls/ca.crt"), on: true},
		{name: "address only", args: full[:1], want: "--agent-server-addr is set, so the agent server also needs --agent-server-url, --agent-server-cert, --agent-server-key, --agent-binaries-dir"},
		{name: "no binaries", args: full[:4], want: "also needs --agent-binaries-dir ("},
		{name: "no address", args: full[1:], want: "set but --agent-server-addr is empty"},
		{name: "CA without address", args: []string{"--agent-server-ca=/tls/ca.crt"}, want: "--agent-server-ca set but --agent-server-addr is empty"},
		{name: "reserve as large as the cap", args: append(full[:len(full):len(full)], "--agent-server-max-conns=32"), want: "--agent-server-reserved-conns (32) must be smaller than --agent-server-max-conns (32)"},
		{name: "reserve without a cap", args: append(full[:len(full):len(full)], "--agent-server-max-conns=-1"), want: "sets no cap to keep them from"},
		{name: "no reserve, no cap", args: append(full[:len(full):len(full)], "--agent-server-max-conns=-1", "--agent-server-reserved-conns=-1"), on: true},
		{name: "negative download timeout", args: append(full[:len(full):len(full)], "--agent-server-download-timeout=-1s"), want: "--agent-server-download-timeout is -1s"},
		{name: "download timeout", args: append(full[:len(full):len(full)], "--agent-server-download-timeout=5m"), on: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("manager", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			f := bindAgentServerFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			opts, err := f.options()
			switch {
			case tc.want != "":
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("error %v, want one containing %q", err, tc.want)
				}
			case err != nil:
				t.Errorf("unexpected error: %v", err)
			case (opts != nil) != tc.on:
				t.Errorf("options = %+v, want the server on: %v", opts, tc.on)
			case opts != nil && (opts.Addr != ":9443" || opts.URL != "https://agents.example.com:9443" || opts.Dir != "/agents" || opts.KeyFile != "/tls/tls.key"):
				t.Errorf("options = %+v", opts)
			}
		})
	}
}
