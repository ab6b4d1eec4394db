// Package quick is the second package shards_test runs through
// hack/go-test-longest-first.sh, beside suite: one test, which passes. It
// is under testdata, so `go test ./...` never runs it.
package quick

import "testing"

func TestPasses(t *testing.T) {}
