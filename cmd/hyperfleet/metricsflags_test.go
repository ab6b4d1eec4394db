package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestMetricsDefaultsAreTheCharts: a manager started with no metrics flag
// serves /metrics as the Helm chart does by default (values.yaml's
// metrics.port and metrics.secure): over HTTPS, each scrape authenticated
// and authorized against the API server, never plain HTTP that anyone who
// reaches the port may read.
func TestMetricsDefaultsAreTheCharts(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "charts", "hyperfleet", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Metrics struct {
			Port   int  `json:"port"`
			Secure bool `json:"secure"`
		} `json:"metrics"`
	}
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	if !values.Metrics.Secure {
		t.Fatal("the chart's metrics.secure is false: its default must not be plain HTTP either")
	}

	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	f := bindMetricsFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	o := f.options()
	if !o.SecureServing || o.FilterProvider == nil {
		t.Fatalf("by default /metrics is served with SecureServing %v and an authentication filter %v: want HTTPS with authentication and authorization, as the chart (metrics.secure)",
			o.SecureServing, o.FilterProvider != nil)
	}
	if want := fmt.Sprintf(":%d", values.Metrics.Port); o.BindAddress != want {
		t.Fatalf("--metrics-bind-address defaults to %q; the chart's metrics.port makes it %q", o.BindAddress, want)
	}

	// Plain HTTP stays possible, asked for by name.
	if err := fs.Parse([]string{"--metrics-secure=false"}); err != nil {
		t.Fatal(err)
	}
	if o := f.options(); o.SecureServing || o.FilterProvider != nil {
		t.Fatalf("--metrics-secure=false: SecureServing %v, filter %v", o.SecureServing, o.FilterProvider != nil)
	}
}
