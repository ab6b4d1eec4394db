# HyperFleet build, generation and test targets. `make help` lists them.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

# Tools are pinned and built into a git-ignored bin dir.
LOCALBIN ?= $(CURDIR)/bin
CONTROLLER_TOOLS_VERSION ?= v0.20.0
GOLANGCI_LINT_VERSION ?= v2.15.0
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)

# golangci-lint takes about 2 minutes to build on 2 cores, so, like the envtest
# binaries, it is built once into a versioned cache directory outside the
# repository (HYPERFLEET_CACHE, else $XDG_CACHE_HOME/hyperfleet, else
# ~/.cache/hyperfleet) that every checkout and CI run shares.
HYPERFLEET_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/hyperfleet

# Every build and test here is static (CGO_ENABLED=0), as the release's and
# the image's binaries are, except the race run (the race detector needs
# cgo) and SPIRE's build (its sqlite datastore): one build configuration,
# so that a package compiled for a test is the one the image, the test
# world's manager processes and the envtest build (hack/envtest, whose
# modules are kept at this module's versions) take from the Go build cache
# instead of compiling it again. With cgo on, the standard library's net
# and os/user differ, and with them every package above them: a fresh
# machine compiled the whole dependency tree once more (docs/testing.md,
# "CI timings"). No package of this module or its dependencies uses cgo.
export CGO_ENABLED ?= 0
# Binaries built here link without DWARF (-ldflags=-w). go test already
# leaves the debug information out of the test binaries it runs and
# removes (-s -w), but not out of those built with go test -c
# (hack/go-test-shards.sh: the controller and real-guest shards, in every
# mode) or with go build (the managers, agents and simulators the tests
# run as processes), and there it is about a quarter of a link's CPU (the
# controller suite's binary: 7.8 CPU-s instead of 10.6, 1.18 GB of memory
# instead of 1.40). Stack traces, the race detector's reports and pprof
# use the symbol table and pclntab, which stay. The release's binaries set
# their own -ldflags (GO_STATIC below), which override this one. A
# GOFLAGS that already names -ldflags is left as it is.
ifeq ($(filter -ldflags=%,$(GOFLAGS)),)
export GOFLAGS := $(strip $(GOFLAGS) -ldflags=-w)
endif
# go test runs without its vet step (-vet=off; go build and the other go
# commands ignore the flag): make lint runs golangci-lint's govet, every
# analyzer go test's vet would, over the same packages and the build tags
# of the suites behind them (.golangci.yml), and CI runs it before any
# test. go test's vet re-vetted every test's package and, for its facts,
# the packages under it, whenever one changed: on a fresh machine 6,800
# vet processes and 340 CPU-seconds. A GOFLAGS that already names -vet is
# left as it is.
ifeq ($(filter -vet=%,$(GOFLAGS)),)
export GOFLAGS := $(strip $(GOFLAGS) -vet=off)
endif
GOLANGCI_LINT_DIR ?= $(HYPERFLEET_CACHE)/tools/golangci-lint-$(GOLANGCI_LINT_VERSION)
GOLANGCI_LINT ?= $(GOLANGCI_LINT_DIR)/golangci-lint

# The real kube-apiserver and etcd, built from source and cached outside the
# repository (see hack/envtest). Tests find them through KUBEBUILDER_ASSETS.
ENVTEST_BUILD := hack/envtest/build.sh
# The helm CLI, built from its Go module into the same cache (see
# hack/helm). The chart's tests (test/chart) find it through HELM.
HELM_BUILD := hack/helm/build.sh
# The real spire-server and spire-agent, built from SPIRE's Go module into
# the same cache with only the plugins the tests configure linked in (see
# hack/spire; about 4 minutes the first time). The SPIRE tests
# (test/spiretest) find them through SPIRE_DIR.
SPIRE_BUILD := hack/spire/build.sh
# The real external-dns, built from its Go module into the same cache with
# only its rfc2136 provider linked (see hack/external-dns; about 3 minutes
# the first time). The external-dns end-to-end test (internal/controller)
# finds it through EXTERNAL_DNS.
EXTERNAL_DNS_BUILD := hack/external-dns/build.sh
# The test world's buildkite-agent: the real agent's agent and api packages
# from its Go module with a main of ours, built into the same cache (see
# hack/buildkite-agent; a few minutes the first time). The Buildkite
# simulator's tests find it through BUILDKITE_AGENT.
BUILDKITE_AGENT_BUILD := hack/buildkite-agent/build.sh

# The Helm chart, the primary install. It installs the same CRDs, rules and
# admission policy as config/: `make manifests` copies them into the chart
# (a chart reads only its own files), and test/chart checks that both
# install the same objects.
CHART_DIR := charts/hyperfleet
# The chart's CRDs are templates (templates/crds), so that helm upgrade
# updates them (Helm never upgrades a chart's crds/ directory): each is
# config/'s, guarded by crds.enabled and, with crds.keep, annotated
# helm.sh/resource-policy: keep so that helm uninstall leaves the CRDs, and
# with them every claim, in place (cert-manager's pattern). CRD_KEEP is the
# awk program that adds the annotation after controller-gen's.
CRD_KEEP := {print} /^    controller-gen.kubebuilder.io\/version:/ { \
	print "    {{- if .Values.crds.keep }}"; print "    helm.sh/resource-policy: keep"; print "    {{- end }}" }
CHART_CONFIG_FILES := rbac/role.yaml rbac/leader_election_role.yaml rbac/metrics_auth_role.yaml \
	rbac/metrics_reader_role.yaml rbac/secret_reader_role.yaml rbac/claim_admin_role.yaml admission/protected_metadata_policy.yaml \
	admission/isolation_tenancy_policy.yaml

GO_TEST_FLAGS ?= -count=1
# TEST_TIMEOUT bounds each package's test binary, a margin for a loaded CI
# machine, not a target: the controller package takes about 6 minutes on the
# 2-core CI machine, and about 3 under -race -short (test-race).
TEST_TIMEOUT ?= 60m
E2E_TIMEOUT ?= 40m
# E2E_RUN selects scenarios (a go test -run pattern); empty runs them all.
E2E_RUN ?=
DEPLOY_TIMEOUT ?= 30m
SPIRE_TIMEOUT ?= 15m
# The real-guest tests: the first run builds the guest image (about 7
# minutes), every run boots guests under emulation (about 15 minutes on a
# loaded 2-core machine).
GUEST_TIMEOUT ?= 45m

# The container image (Containerfile): the operator for IMAGE_ARCH and the
# agent for every platform the agent server serves, static (CGO_ENABLED=0),
# staged with the build host's CA bundle into the git-ignored dist/image.
IMAGE ?= ghcr.io/hyperfleet/hyperfleet:latest
IMAGE_ARCH ?= $(shell go env GOARCH)
AGENT_PLATFORMS ?= linux/amd64 linux/arm64
IMAGE_CONTEXT ?= $(CURDIR)/dist/image
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt
# podman first: a docker client without an engine is common (and is what
# this machine has); hack/podman/setup.sh installs podman on Debian.
CONTAINER_TOOL ?= $(shell command -v podman 2>/dev/null || command -v docker 2>/dev/null)
# VERSION is what hyperfleet_build_info{version} reports: the chart's
# appVersion unless given.
VERSION ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' charts/hyperfleet/Chart.yaml)
GO_STATIC := CGO_ENABLED=0 go build -trimpath -ldflags='-s -w -X github.com/hyperfleet/hyperfleet/internal/metrics.Version=$(VERSION)'

.PHONY: all
all: generate manifests docs build

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z0-9_-]+:.*?##/ { printf "  %-14s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

##@ Generation

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code for the API types.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths="./api/..."

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate CRDs and RBAC into config/ and copy them (the CRDs as templates, the roles and admission policy as files) into the chart.
	$(CONTROLLER_GEN) crd paths="./api/..." output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=hyperfleet-manager paths="./internal/..." output:rbac:artifacts:config=config/rbac
	rm -rf $(CHART_DIR)/crds $(CHART_DIR)/templates/crds $(CHART_DIR)/files/config
	mkdir -p $(CHART_DIR)/templates/crds
	for f in config/crd/bases/*.yaml; do \
		{ echo '{{- if .Values.crds.enabled }}'; awk '$(CRD_KEEP)' $$f; echo '{{- end }}'; } > $(CHART_DIR)/templates/crds/$$(basename $$f); \
	done
	for f in $(CHART_CONFIG_FILES); do \
		mkdir -p $(CHART_DIR)/files/config/$$(dirname $$f) && cp config/$$f $(CHART_DIR)/files/config/$$f; \
	done

.PHONY: docs
docs: manifests ## Generate the per-kind API reference in docs/reference, the chart's values table in its README and the package table of docs/architecture.md.
	go run ./hack/crd-docs --crds config/crd/bases --samples config/samples --out docs/reference
	go run ./hack/pkg-docs --doc docs/architecture.md
	go run ./hack/chart-docs --values $(CHART_DIR)/values.yaml --readme $(CHART_DIR)/README.md

##@ Development

.PHONY: fmt
fmt: ## Run gofmt on the code.
	gofmt -s -w $$(git ls-files '*.go')

.PHONY: vet
vet: ## Run go vet.
	go vet ./...

.PHONY: lint
# --allow-serial-runners: another golangci-lint on the machine (a second
# checkout's make lint) holds its lock; wait for it instead of failing
# ("parallel golangci-lint is running", which failed a CI run once).
lint: $(GOLANGCI_LINT) ## Run golangci-lint (.golangci.yml; the binary is built once into the cache), also on the agent's Windows build.
	$(GOLANGCI_LINT) run --allow-serial-runners ./...
	GOOS=windows GOARCH=amd64 $(GOLANGCI_LINT) run --allow-serial-runners ./cmd/hyperfleet-agent/ ./internal/agent/ ./internal/tpmdevid/

.PHONY: agent-windows
agent-windows: ## Build the agent for Windows guests (docs/windows.md) into bin/windows-amd64/.
	GOOS=windows GOARCH=amd64 $(GO_STATIC) -o $(LOCALBIN)/windows-amd64/hyperfleet-agent.exe ./cmd/hyperfleet-agent

.PHONY: build
build: ## Build every binary into bin/.
	go build -o $(LOCALBIN)/ ./cmd/...

.PHONY: image-context
image-context: ## Build the static binaries and stage the image's build context in dist/image.
	@test -s $(CA_BUNDLE) || { echo "no CA bundle at $(CA_BUNDLE): install Debian's ca-certificates or set CA_BUNDLE" >&2; exit 1; }
	rm -rf $(IMAGE_CONTEXT)
	mkdir -p $(IMAGE_CONTEXT)/etc $(IMAGE_CONTEXT)/agent
	GOOS=linux GOARCH=$(IMAGE_ARCH) $(GO_STATIC) -o $(IMAGE_CONTEXT)/linux-$(IMAGE_ARCH)/hyperfleet ./cmd/hyperfleet
	for p in $(AGENT_PLATFORMS); do \
		GOOS=$${p%/*} GOARCH=$${p#*/} $(GO_STATIC) -o $(IMAGE_CONTEXT)/agent/hyperfleet-agent-$${p%/*}-$${p#*/} ./cmd/hyperfleet-agent; \
	done
	cp hack/image/passwd hack/image/group $(IMAGE_CONTEXT)/etc/
	cp LICENSE NOTICE $(IMAGE_CONTEXT)/
	cp $(CA_BUNDLE) $(IMAGE_CONTEXT)/ca-certificates.crt
	chmod -R a+rX,go-w $(IMAGE_CONTEXT)

.PHONY: image
image: image-context ## Build the container image IMAGE for IMAGE_ARCH (podman, else docker); pulls nothing.
	@test -n "$(CONTAINER_TOOL)" || { echo "neither podman nor docker found: hack/podman/setup.sh installs podman" >&2; exit 1; }
	$(CONTAINER_TOOL) build --platform linux/$(IMAGE_ARCH) -f Containerfile -t $(IMAGE) $(IMAGE_CONTEXT)

.PHONY: release
# DIST is where make release writes; COSIGN_KEY (with COSIGN_PASSWORD) signs,
# else a throwaway key pair does (docs/release.md).
DIST ?= $(CURDIR)/dist/release
release: ## Build, sign and verify everything a release publishes into DIST, offline: both architectures' image (one index) and binaries, SBOMs, the chart pinned to the image's digest.
	DIST="$(DIST)" HELM="$$($(HELM_BUILD))" hack/release/release.sh

.PHONY: tools
tools: ## Build (or find cached) every tool the tests use, a progress line each: the first make test on a fresh machine builds them as it goes (about 75 minutes on 2 cores).
	@GOLANGCI_LINT="$(GOLANGCI_LINT)" CONTROLLER_GEN="$(CONTROLLER_GEN)" hack/tools.sh

.PHONY: release-tools
release-tools: ## Build (or reuse) the cached syft, cosign and sign-image; prints their directory.
	@hack/release/build.sh

.PHONY: envtest
envtest: ## Build (or reuse) the cached kube-apiserver and etcd; prints their directory.
	@$(ENVTEST_BUILD)

.PHONY: helm
helm: ## Build (or reuse) the cached helm CLI; prints its path.
	@$(HELM_BUILD)

.PHONY: spire
spire: ## Build (or reuse) the cached spire-server and spire-agent; prints their directory.
	@$(SPIRE_BUILD)

.PHONY: external-dns
external-dns: ## Build (or reuse) the cached external-dns; prints its path.
	@$(EXTERNAL_DNS_BUILD)

.PHONY: buildkite-agent
buildkite-agent: ## Build (or reuse) the cached test-world buildkite-agent; prints its path.
	@$(BUILDKITE_AGENT_BUILD)

.PHONY: test-deps
test-deps: ## Install the system programs tests run (Debian's cloud-init).
	hack/test-deps.sh

# The controller suite (internal/controller) is most of make test's time
# (about 500 s alone) while it uses about 0.4 of a core, waiting on timers,
# requeues and its API server: it runs as CONTROLLER_SHARDS test processes
# (hack/go-test-shards.sh), beside go test over every other package.
# GO_TEST_FLAGS applies to the other packages; to run some controller tests,
# go test ./internal/controller -run ... with KUBEBUILDER_ASSETS set.
CONTROLLER_PKG := github.com/hyperfleet/hyperfleet/internal/controller
CONTROLLER_SHARDS ?= 3
CONTROLLER_RACE_SHARDS ?= 2
# TEST_PARALLEL and RACE_PARALLEL are how many of the other packages go
# test builds and runs at once, beside the controller shards in make test
# and in the race run's last part, longest first by the times the last run
# recorded (hack/go-test-longest-first.sh). More than the two cores: those
# packages mostly wait (the agent's job runs, helm, their API servers),
# and at go test's default of two, one slow package held a slot for
# minutes while the cores idled; at a time of their own, make test's
# last 230 s ran 60 % busy and the race run's last 240 s 50 % (warm run at
# c507136, docs/testing.md, "CI timings").
TEST_PARALLEL ?= 3
RACE_PARALLEL ?= 3

# COMPILE_TESTS compiles every package and test package (export data, no
# link): the race run does it first, so that its parts run tests, not
# builds; warm, it checks the cache in about 2 seconds.
COMPILE_TESTS = go list -test -export -deps $(1) ./... >/dev/null

# The other packages are built and tested at a lower priority (nice 10)
# than the controller shards: with a cold build cache (a new machine, or a
# fresh clone in a new directory built without -trimpath, which CI sets)
# their builds kept both cores busy and starved the shards' scenarios past
# their bounds on a hang; compiling them all first instead put the whole
# compile (minutes in a fresh clone) before the shards rather than beside
# their waits.
.PHONY: test
test: test-deps ## Run every test against the real API server (builds it, helm, external-dns and buildkite-agent on first use).
	@export KUBEBUILDER_ASSETS="$$($(ENVTEST_BUILD))" HELM="$$($(HELM_BUILD))" EXTERNAL_DNS="$$($(EXTERNAL_DNS_BUILD))" BUILDKITE_AGENT="$$($(BUILDKITE_AGENT_BUILD))"; rc=0; \
	hack/go-test-shards.sh -n $(CONTROLLER_SHARDS) -timeout $(TEST_TIMEOUT) $(CONTROLLER_PKG) & shards=$$!; \
	nice -n 10 hack/go-test-longest-first.sh $(GO_TEST_FLAGS) -p $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) -- $$(go list ./... | grep -vxF $(CONTROLLER_PKG)) || rc=1; \
	wait $$shards || rc=1; exit $$rc

.PHONY: test-race
# In three runs. First the controller suite as CONTROLLER_RACE_SHARDS
# processes (hack/go-test-shards.sh; it waits more than it computes, even
# under the race detector). Then the other packages whose tests start the
# real API server (their test dependencies include test/testenv or
# controller-runtime's envtest) one at a time (-p 1): race-instrumented
# envtest packages of different kinds side by side starved each other's API
# servers into timeouts on a 2-core machine. Last every package that starts
# no API server, RACE_PARALLEL at a time and longest first, so that linking
# race-instrumented test binaries overlaps running the slow ones. The
# parts that wait come first and the one that computes last: in CI the
# race run starts beside three lanes of steps that wait too, and its
# computing part then has the cores those lanes leave when they end;
# the other way round, its waiting parts ran alone after them, the cores
# half idle for 7.5 minutes (docs/testing.md, "CI timings").
# -vet=off (as GOFLAGS has it above, said again for a GOFLAGS that
# names -vet): vet reads the source, which make lint (golangci-lint's
# govet) has checked; under -race its facts are another build's, so a
# fresh machine vetted the whole dependency tree a second time (about 460
# CPU-seconds in make test's cold run), for nothing.
API_TEST_PKGS = go list -test -f '{{if .ForTest}}{{.ForTest}} {{join .Deps " "}}{{end}}' ./... | \
	awk '/ sigs\.k8s\.io\/controller-runtime\/pkg\/envtest( |$$)| github\.com\/hyperfleet\/hyperfleet\/test\/testenv( |$$)/ { print $$1 }' | sort -u
# RACE_SKIP are the packages the race run leaves out: their tests drive the
# API server (CEL and admission rules, the CRDs' schemas, the chart's
# objects through helm, the alert rules through promtool) from one
# goroutine and link no package of the operator's but the API types and
# the test world's API server wrapper, so the race detector has nothing of
# ours to watch there (under it the first four took 135 s of the race run's
# one-at-a-time part); or they read the repository's own text (the doc
# generators and their markers, the Proxmox role table's generator,
# test/repo's checks). test/repo (TestRaceSkipLinksNoConcurrentCode) fails
# when one of them starts linking more.
RACE_SKIP := github.com/hyperfleet/hyperfleet/api/v1alpha1 github.com/hyperfleet/hyperfleet/test/admission \
	github.com/hyperfleet/hyperfleet/test/chart github.com/hyperfleet/hyperfleet/test/testenv \
	github.com/hyperfleet/hyperfleet/test/monitoring github.com/hyperfleet/hyperfleet/test/repo \
	github.com/hyperfleet/hyperfleet/hack/pkg-docs github.com/hyperfleet/hyperfleet/hack/crd-docs \
	github.com/hyperfleet/hyperfleet/hack/internal/markers github.com/hyperfleet/hyperfleet/hack/proxmox-roles
test-race: test-deps ## Run the tests under the race detector (the API server's packages one at a time), without the long controller scenarios (-short) and RACE_SKIP.
	@export CGO_ENABLED=1; api="$$($(API_TEST_PKGS) | grep -vxF $(foreach p,$(RACE_SKIP),-e $(p)))"; test -n "$$api" || { echo "test-race: found no package that starts the API server" >&2; exit 1; }; \
	unit="$$(go list ./... | grep -vxF $(foreach p,$(RACE_SKIP),-e $(p)) | grep -vxF "$$api")"; \
	export KUBEBUILDER_ASSETS="$$($(ENVTEST_BUILD))" HELM="$$($(HELM_BUILD))" EXTERNAL_DNS="$$($(EXTERNAL_DNS_BUILD))" BUILDKITE_AGENT="$$($(BUILDKITE_AGENT_BUILD))"; rc=0; \
	$(call COMPILE_TESTS,-race) || exit 1; \
	hack/go-test-shards.sh -n $(CONTROLLER_RACE_SHARDS) -race -short -timeout $(TEST_TIMEOUT) $(CONTROLLER_PKG) || rc=1; \
	api="$$(echo "$$api" | grep -vxF $(CONTROLLER_PKG))"; \
	echo "go test -race -short -p 1 (the API server's): $$(echo $$api | wc -w) packages"; \
	go test -race -short -vet=off -p 1 $(GO_TEST_FLAGS) -timeout $(TEST_TIMEOUT) $$api || rc=1; \
	echo "go test -race -short ($(RACE_PARALLEL) at a time, longest first): $$(echo $$unit | wc -w) packages"; \
	hack/go-test-longest-first.sh -race -short -vet=off -p $(RACE_PARALLEL) $(GO_TEST_FLAGS) -timeout $(TEST_TIMEOUT) -- $$unit || rc=1; \
	exit $$rc

.PHONY: test-e2e
test-e2e: test-deps ## Run the end-to-end scenarios: operator, both simulators, the real agent in every VM.
	KUBEBUILDER_ASSETS="$$($(ENVTEST_BUILD))" BUILDKITE_AGENT="$$($(BUILDKITE_AGENT_BUILD))" go test -tags e2e -count=1 -timeout $(E2E_TIMEOUT) -v -run '$(E2E_RUN)' ./test/e2e/

.PHONY: test-stress
# The packages that drive operators (the controller suite, the failsafe
# tests, the end-to-end scenarios), STRESS_COUNT times each, STRESS_PROCS
# test processes at once (twice the cores: contention on purpose), with a
# table of each test's failures at the end (hack/test-stress.sh,
# docs/testing.md, "Stress"). Hours on 2 cores; not in CI.
STRESS_COUNT ?= 10
test-stress: test-deps ## Run the operator-driving packages STRESS_COUNT times under CPU contention and list every failure by test.
	KUBEBUILDER_ASSETS="$$($(ENVTEST_BUILD))" HELM="$$($(HELM_BUILD))" EXTERNAL_DNS="$$($(EXTERNAL_DNS_BUILD))" BUILDKITE_AGENT="$$($(BUILDKITE_AGENT_BUILD))" \
		STRESS_COUNT=$(STRESS_COUNT) hack/test-stress.sh

.PHONY: test-deploy
test-deploy: test-deps ## Build the image with podman, install the chart as docs/install.md and the quick starts say (their commands run as written), and run jobs in the Deployment's pod.
	export CONTAINERS_CONF="$$(hack/podman/setup.sh)"; \
	KUBEBUILDER_ASSETS="$$($(ENVTEST_BUILD))" HELM="$$($(HELM_BUILD))" BUILDKITE_AGENT="$$($(BUILDKITE_AGENT_BUILD))" go test -tags deploy -count=1 -timeout $(DEPLOY_TIMEOUT) -v ./test/deploy/

.PHONY: test-flood
# The manager process (built from cmd/hyperfleet) under floods of hostile
# connections against its agent server and webhook receiver: stalled
# requests with bogus tokens, HTTP/2 streams, zero-window downloads, one
# address and 40; its RSS stays within 64 MiB of its rest level while a
# job still runs to the end (docs/security.md; about 3 minutes).
test-flood: test-deps ## Run the flood test (build tag flood) against the built manager process.
	KUBEBUILDER_ASSETS="$$($(ENVTEST_BUILD))" go test -tags flood -count=1 -timeout 10m -v ./test/flood/

.PHONY: test-chaos test-chaos-small
# The chaos run (test/chaos, build tag chaos; docs/testing.md, "Chaos"):
# CHAOS_CLAIMS claims' jobs through four pools on three simulated Proxmox
# VE clusters while Proxmox and GitHub calls fail, manager replicas are
# killed, the API server restarts, a node goes offline and a cluster is
# partitioned away (a network namespace: root, ip and nft). The full run
# writes docs/reliability.md and measures the load figures (CHAOS_LOAD
# cycles); the small one, which CI runs, writes its report into a
# temporary directory.
CHAOS_CLAIMS ?= 1000
# The small run's 150 claims still meet every fault kind (the schedule's
# steps go by progress, the random faults hit every kind at these rates):
# 230 s alone against 435 for 300 claims, about 360 CPU-s against 600.
CHAOS_SMALL_CLAIMS ?= 150
CHAOS_LOAD ?= 5
CHAOS_TIMEOUT ?= 90m
test-chaos: ## The full chaos run (1,000 claims, every fault, the load figures); writes docs/reliability.md.
	hack/test-deps.sh --chaos
	go test -tags chaos -count=1 -timeout 5m -v ./internal/testworld/netns/
	SPIRE_DIR="$$($(SPIRE_BUILD))" KUBEBUILDER_ASSETS="$$($(ENVTEST_BUILD))" CHAOS_CLAIMS=$(CHAOS_CLAIMS) CHAOS_LOAD=$(CHAOS_LOAD) HF_CHAOS_OUT=$(CURDIR)/docs \
		go test -tags chaos -count=1 -timeout $(CHAOS_TIMEOUT) -v -run TestChaos ./test/chaos/

test-chaos-small: ## The reduced chaos run CI runs (150 claims, every fault kind at least once, about 4 minutes).
	hack/test-deps.sh --chaos
	go test -tags chaos -count=1 -timeout 5m -v ./internal/testworld/netns/
	SPIRE_DIR="$$($(SPIRE_BUILD))" KUBEBUILDER_ASSETS="$$($(ENVTEST_BUILD))" CHAOS_CLAIMS=$(CHAOS_SMALL_CLAIMS) CHAOS_TIMEOUT_MINUTES=25 \
		go test -tags chaos -count=1 -timeout 30m -v -run TestChaos ./test/chaos/

.PHONY: test-release
# About 4 minutes warm (the arm64 build and both images), plus about 7 the
# first time for syft and cosign (hack/release/build.sh).
test-release: ## Run make release with a key the test generates and check every artifact (build tag release).
	HELM="$$($(HELM_BUILD))" go test -tags release -count=1 -timeout 30m -v ./test/release/

.PHONY: test-libvirt
# The libvirt provider's contract suite (pkg/provider/libvirt, build tag
# libvirtcontract): pkg/provider/providertest against a real libvirtd
# (Debian's, started privately per test in its own namespaces by
# internal/testworld/libvirtd) whose guests are real QEMU guests under TCG
# (internal/testworld/tinyguest: Debian's cloud kernel and a Go /init with
# a QEMU guest agent, about 3.4 CPU-s a boot). make test runs the
# package's fault and transport tests without the tag; the suite boots
# about 50 guests, so CI runs it in a lane of its own beside the SPIRE
# tests, which mostly wait.
LIBVIRT_TIMEOUT ?= 30m
test-libvirt: test-deps ## Run the libvirt provider's contract suite against a real libvirtd and real guests under TCG.
	go test -tags libvirtcontract -count=1 -timeout $(LIBVIRT_TIMEOUT) -v -run '^(TestContract|TestIsolationFilter|TestIsolationEnforced|TestSuspendedVMAcrossRestartAndDisown|TestHardwareDefined)$$' ./pkg/provider/libvirt/

.PHONY: test-spire
# The SPIRE tests mostly wait for agents to attest and sync, so they run in
# parallel beyond the machine's cores (go test's -parallel defaults to them).
# internal/agent's are the ones its spire-tagged files add, by name (-run
# 'SPIRE$$', which TestSPIRETaggedTestsEndInSPIRE keeps true): make test ran
# the package's others.
test-spire: test-deps ## Run the SPIRE tests (build tag spire): a real spire-server, a spire-agent per simulated VM, the agent's broker mode, and the SPIFFE end-to-end scenarios.
	SPIRE_DIR="$$($(SPIRE_BUILD))" go test -tags spire -count=1 -parallel 4 -timeout $(SPIRE_TIMEOUT) -v ./test/spiretest/
	SPIRE_DIR="$$($(SPIRE_BUILD))" go test -tags spire -count=1 -parallel 4 -timeout $(SPIRE_TIMEOUT) -v -run 'SPIRE$$' ./internal/agent/
	SPIRE_DIR="$$($(SPIRE_BUILD))" KUBEBUILDER_ASSETS="$$($(ENVTEST_BUILD))" go test -tags 'e2e spire' -count=1 -timeout $(E2E_TIMEOUT) -v -run SPIFFE ./test/e2e/

# GUEST_TIMINGS is where make test-guest writes each real-guest
# scenario's VM milestones (<test name>.json, docs/testing.md) and where
# make bench reads them for the report's "Real guests" table: outside the
# repository, kept between runs.
GUEST_TIMINGS ?= $(HOME)/.cache/hyperfleet/guest-timings
# GUEST_PARALLEL is how many test processes run the real-guest scenarios side
# by side (hack/go-test-shards.sh deals the scenarios out among them): each
# guest is one QEMU (TCG) thread, so two keep both cores of the CI machine
# busy while the other's operator and simulators wait on its guest.
GUEST_PARALLEL ?= 2

# GUEST_RUN selects the scenarios (a go test -run expression over their
# names): make test-guest runs them all. GUEST_SMALL_RUN is the set CI runs
# (make test-guest-small): every way a VM gets its configuration, network
# and identity on a real guest (the Proxmox API itself, the loop with the
# agent from the operator, Proxmox's own cloud-init drive, static
# addresses with the TPM on one guest, SPIFFE with a join token, and the
# DHCP reservation against the real ISC client), a GitHub job on a guest
# of a real libvirtd (devenv Options.Libvirt) taken from the standby tier
# (booted, suspended to disk with a managed save, resumed for the job, its
# clock checked), and the standby tier on a real guest of the Proxmox
# simulator (TestStandbyOnRealGuest: its VM suspended to disk and resumed
# for its job, with its clock, entropy and DHCP lease made fresh by the
# agent; it resumes twice, the image's state and then its own, and boots
# none), 9 guests of make test-guest's 13. Left to make test-guest: the
# DHCP client identifier scenarios on real guests (two guests; CI keeps the
# ISC client's against the same dnsmasq) and the GitLab and Buildkite jobs
# on real guests (CI runs both platforms' loops with the same agent in the
# simulated VMs of make test and make test-e2e). Each guest that boots
# costs about 70 to 100 CPU-seconds of QEMU (TCG), most of it cloud-init's
# Python (docs/testing.md, "CI timings"); only three of the 9 boot (the TPM
# guest with static addresses, Proxmox's drive, the libvirt guest:
# libvirt's clones resume no saved state), the others resume a saved
# state, about 20 each (docs/guest-snapshots.md). Each QEMU's CPU time
# goes to $(GUEST_TIMINGS)/qemu-cpu.log.
GUEST_RUN ?= .*
GUEST_SMALL_RUN := ^(TestRealGuestThroughTheProxmoxAPI|TestRunnerPoolJobsOnRealGuests|TestProxmoxDeliveryOnRealGuests|TestTPMAndStaticAddressOnRealGuest|TestSPIFFEOnRealGuest|TestDHCPReservationWithISCClient|TestGitHubJobOnLibvirt|TestStandbyOnRealGuest)$$

.PHONY: test-guest test-guest-small
test-guest: test-deps ## Run the real-guest tests (build tag guest): QEMU guests of the image hack/guest-image builds from docs/templates.md.
	hack/test-deps.sh --guest
	mkdir -p "$(GUEST_TIMINGS)" && rm -f "$(GUEST_TIMINGS)/qemu-cpu.log"
	SPIRE_DIR="$$($(SPIRE_BUILD))" KUBEBUILDER_ASSETS="$$($(ENVTEST_BUILD))" BUILDKITE_AGENT="$$($(BUILDKITE_AGENT_BUILD))" HF_GUEST_TIMINGS_OUT="$(GUEST_TIMINGS)" \
		HF_QEMU_CPU_LOG="$(GUEST_TIMINGS)/qemu-cpu.log" hack/go-test-shards.sh -v -n $(GUEST_PARALLEL) -tags guest -timeout $(GUEST_TIMEOUT) -run '$(GUEST_RUN)' ./test/guest

test-guest-small: ## The real-guest scenarios CI runs (GUEST_SMALL_RUN: 9 guests of make test-guest's 13).
	$(MAKE) test-guest GUEST_RUN='$(GUEST_SMALL_RUN)'

.PHONY: dev
dev: ## Run the whole loop locally (cmd/hyperfleet-dev); DEV_FLAGS passes flags, e.g. DEV_FLAGS="--jobs 10".
	hack/test-deps.sh --dev
	go run ./cmd/hyperfleet-dev $(DEV_FLAGS)

# make bench measures the operator against its performance targets
# (docs/architecture.md, "Performance targets") and writes
# docs/performance.md and its timeline figure (test/bench, build tag
# bench): the controller package's power-off benchmark (10 clusters of 10
# claims, 100 VMs powered off at once), then the manager binary as its own
# process through cold, warm and standby starts, 250 / 1,000 / 4,000 claims over 10
# clusters, claim overhead against a bare client and churn. About 14 minutes
# on 2 cores (the standby starts about 3 of them). The report's "Real guests" table comes from the timings the
# last make test-guest wrote into GUEST_TIMINGS. BENCH_OUT is where the report goes; bench-small runs every
# part at a toy size into a temporary directory (CI: it runs, and the report
# is written; no speed is asserted).
BENCH_OUT ?= $(CURDIR)/docs
BENCH_TIMEOUT ?= 30m
BENCH_POWEROFF_SIZE ?= 10x10

.PHONY: bench
bench: ## Run the benchmarks and write docs/performance.md.
	@tmp="$$(mktemp -d)"; trap 'rm -rf "$$tmp"' EXIT; \
	export KUBEBUILDER_ASSETS="$$($(ENVTEST_BUILD))"; \
	HF_BENCH_SIZE=$(BENCH_POWEROFF_SIZE) go test -count=1 -run '^$$' -bench BenchmarkOperator1000Claims -benchtime 1x -timeout $(BENCH_TIMEOUT) ./internal/controller/ | tee "$$tmp/poweroff.txt"; \
	HF_BENCH_OUT=$(BENCH_OUT) HF_BENCH_POWEROFF="$$tmp/poweroff.txt" HF_BENCH_GUEST_TIMINGS="$(GUEST_TIMINGS)" go test -tags bench -count=1 -run TestBench -v -timeout $(BENCH_TIMEOUT) ./test/bench/

.PHONY: bench-small
bench-small: ## Run every benchmark at a toy size and write its report into a temporary directory.
	@tmp="$$(mktemp -d)"; trap 'rm -rf "$$tmp"' EXIT; \
	export KUBEBUILDER_ASSETS="$$($(ENVTEST_BUILD))"; \
	go test -count=1 -run '^$$' -bench . -benchtime 1x ./internal/ipam/ ./internal/testworld/simulator/proxmox/ ./pkg/provider/proxmox/; \
	HF_BENCH_SMALL=1 go test -count=1 -run '^$$' -bench BenchmarkOperator1000Claims -benchtime 1x -timeout $(BENCH_TIMEOUT) ./internal/controller/ | tee "$$tmp/poweroff.txt"; \
	HF_BENCH_SMALL=1 HF_BENCH_OUT="$$tmp/report" HF_BENCH_POWEROFF="$$tmp/poweroff.txt" HF_BENCH_GUEST_TIMINGS="$(GUEST_TIMINGS)" go test -tags bench -count=1 -run TestBench -v -timeout $(BENCH_TIMEOUT) ./test/bench/; \
	test -s "$$tmp/report/performance.md"

# hack/buildkite-agent's tidy runs with -e: tidy also walks the agent
# module's tests, whose clicommand package imports drjosh.dev/zzglob, which
# the module proxy refuses (hack/buildkite-agent/main.go); the build needs
# none of it.
.PHONY: verify
verify: generate manifests docs fmt ## Regenerate everything and fail if the tree changed.
	go run ./hack/proxmox-roles --roles pkg/provider/proxmox/testdata/roles.json --install docs/install.md --table docs/proxmox-privileges.md
	go mod tidy
	cd hack/envtest && go mod tidy
	cd hack/spire && go mod tidy
	cd hack/buildkite-agent && go mod tidy -e 2>/dev/null
	cd hack/release && go mod tidy
	@if [ -n "$$(git status --porcelain)" ]; then \
		echo "Generated files are out of date; run 'make verify' and commit the result:"; \
		git status --porcelain; git --no-pager diff --stat; exit 1; \
	fi

##@ Tools

$(LOCALBIN):
	mkdir -p $(LOCALBIN)

$(CONTROLLER_GEN): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)
	mv $(LOCALBIN)/controller-gen $@

$(GOLANGCI_LINT):
	@echo "Building golangci-lint $(GOLANGCI_LINT_VERSION) into $(GOLANGCI_LINT_DIR) (takes about 2 minutes on 2 cores)" >&2
	mkdir -p $(GOLANGCI_LINT_DIR)
	GOBIN=$(GOLANGCI_LINT_DIR) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
