// Package repo checks what the repository says about itself and the tools
// it builds and tests with, none of which runs the operator: the front
// pages' claims (docs_test.go: project files, the README, the status
// table), the make targets' test selections (tagged_tests_test.go), the
// build cache a fresh machine fills once (buildcache_test.go), the test
// scripts that shard and order the suites (shards_test.go), the CI
// platforms' names staying in their own packages
// (platform_literals_test.go), and the hypervisor seam: shared code names
// no hypervisor kind (kindseam_test.go). One test binary for all six: each
// was a package of a few hundred lines, and each package is a test binary
// to link in make test and again in the race run.
package repo
