# addon-heartbeat: the two front-door commands are `make demo` and `make test`.
# Everything they need is built from the Go module proxy; nothing but Go is
# required on the machine.

SHELL := /usr/bin/env bash -o pipefail
GO ?= go
GOTESTFLAGS ?=
# kube-apiserver and etcd, built once into a cache folder outside the checkout
# (hack/kube-binaries.sh prints it as its last line). KUBE_VERSION=v1.30.14
# make test runs the tests on another Kubernetes release (see test-matrix).
ASSETS = $(shell KUBE_VERSION=$(KUBE_VERSION) hack/kube-binaries.sh | tail -n 1)
# The Kubernetes releases of `make test-matrix`: the oldest the chart supports
# (OpenShift 4.17), OpenShift 4.20's, and the newest, which make test runs.
KUBE_MATRIX ?= v1.30.14 v1.33.13 v1.37.2
# The SDK (pkg/heartbeat) is a module of its own, tested at the releases it
# declares (go.mod) and, in test/sdk, inside an addon's controller-runtime
# manager at the oldest Go it supports and at the newest: the go command
# downloads that Go from the module proxy once (about 70 MB).
SDK_OLDEST_GO ?= go1.22.12
# OLM's operator for test/e2e (an addon installed from a ClusterServiceVersion),
# built once into the same cache (hack/olm-binary.sh).
OLM_ASSETS = $(shell hack/olm-binary.sh | tail -n 1)
# Prometheus and promtool for the tests of the chart's alerts and dashboard
# (test/chart, test/e2e), built once into the same cache
# (hack/prometheus-binaries.sh).
PROMETHEUS_ASSETS = $(shell hack/prometheus-binaries.sh | tail -n 1)

.PHONY: all
all: build

.PHONY: build
build: ## Build the webhook, the reporter and addon-heartbeat (also as the kubectl plugin kubectl-addon_heartbeat) into bin/.
	$(GO) build -o bin/ ./cmd/...
	@# kubectl runs `kubectl addon-heartbeat` as the executable kubectl-addon_heartbeat
	@# on the PATH: the same binary under that name.
	cp -f bin/addon-heartbeat bin/kubectl-addon_heartbeat

.PHONY: envtest-assets
envtest-assets: ## Build kube-apiserver, etcd, OLM's operator, Prometheus and promtool for the tests (slow once, then cached; KUBE_VERSION=v1.30.14 for another release).
	@KUBE_VERSION=$(KUBE_VERSION) hack/kube-binaries.sh
	@hack/olm-binary.sh
	@hack/prometheus-binaries.sh

.PHONY: test
test: ## Run every test against a real kube-apiserver and etcd.
	@assets="$(ASSETS)" && olm="$(OLM_ASSETS)" && prom="$(PROMETHEUS_ASSETS)" && \
	echo "KUBEBUILDER_ASSETS=$$assets OLM_ASSETS=$$olm PROMETHEUS_ASSETS=$$prom" && \
	KUBEBUILDER_ASSETS="$$assets" OLM_ASSETS="$$olm" PROMETHEUS_ASSETS="$$prom" $(GO) test -race -count=1 $(GOTESTFLAGS) ./... && \
	cd pkg/heartbeat && KUBEBUILDER_ASSETS="$$assets" $(GO) test -race -count=1 $(GOTESTFLAGS) ./... && \
	cd ../../test/sdk/addon && KUBEBUILDER_ASSETS="$$assets" GOTOOLCHAIN=$(SDK_OLDEST_GO) $(GO) test -race -count=1 $(GOTESTFLAGS) ./... && \
	cd ../newest && KUBEBUILDER_ASSETS="$$assets" $(GO) test -race -count=1 $(GOTESTFLAGS) ./...
	@# OpenShift's own SCC admission on the injected pods: a module of its own
	@# (k8s.io/kubernetes v1.36, test/openshift/README.md), run without -race:
	@# it exercises upstream code single-threaded, and -race doubles its build.
	@cd test/openshift && $(GO) test -count=1 $(GOTESTFLAGS) ./...

.PHONY: test-matrix
test-matrix: ## Run the suites that start an API server (envtest, test/e2e) on each Kubernetes release of KUBE_MATRIX.
	@KUBE_MATRIX="$(KUBE_MATRIX)" GOTESTFLAGS="$(GOTESTFLAGS)" hack/test-matrix.sh

.PHONY: test-stress
test-stress: ## Run the time-sensitive suites RUNS times (default 10) beside a CPU hog on every core.
	@assets="$(ASSETS)" && olm="$(OLM_ASSETS)" && prom="$(PROMETHEUS_ASSETS)" && KUBEBUILDER_ASSETS="$$assets" OLM_ASSETS="$$olm" PROMETHEUS_ASSETS="$$prom" hack/test-stress.sh

.PHONY: demo
demo: ## Run the whole path on a local control plane: webhook, example addon, heartbeats (DEMO_FLAGS=--duration=2m).
	@echo "==> Compiling the demo driver (the first time, Go downloads and builds its modules: a few minutes)"
	@# Static and -trimpath, as the demo then builds the webhook and the reporter
	@# (internal/localcluster.Build): they reuse the packages compiled here.
	@CGO_ENABLED=0 $(GO) build -trimpath -o bin/demo ./hack/demo
	@bin/demo $(DEMO_FLAGS)

.PHONY: bench
bench: ## Run the Go benchmarks (figures in BENCHMARKS.md).
	@assets="$(ASSETS)" && KUBEBUILDER_ASSETS="$$assets" $(GO) test -run '^$$' -bench . -benchmem -count=$${COUNT:-1} ./... && \
	cd pkg/heartbeat && KUBEBUILDER_ASSETS="$$assets" $(GO) test -run '^$$' -bench . -benchmem -count=$${COUNT:-1} ./...

IMAGE ?= ghcr.io/addon-heartbeat/addon-heartbeat:v0.2.0
CONTAINER_TOOL ?= docker
.PHONY: images
images: ## Build the image holding /webhook and /reporter (needs a container engine; CONTAINER_TOOL=podman works too).
	$(CONTAINER_TOOL) build -t $(IMAGE) .

.PHONY: vet
vet:
	$(GO) vet ./...
	cd pkg/heartbeat && $(GO) vet ./...
	cd test/sdk/addon && GOTOOLCHAIN=$(SDK_OLDEST_GO) $(GO) vet ./...
	cd test/sdk/newest && $(GO) vet ./...

.PHONY: sim
sim: ## Run the election simulation over SCHEDULES random schedules (default 10000; make test runs 100), failing on any violation.
	@assets="$(ASSETS)" && cd pkg/heartbeat && KUBEBUILDER_ASSETS="$$assets" $(GO) test -run '^TestSim$$' -count=1 -timeout 2h -args -sim.strict -sim.schedules=$${SCHEDULES:-10000}

.PHONY: fuzz
fuzz: ## Fuzz the injector for FUZZTIME (default 60s).
	$(GO) test ./pkg/inject -run '^$$' -fuzz FuzzInject -fuzztime $${FUZZTIME:-60s}

.PHONY: help
help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "%-16s %s\n", $$1, $$2}'

.PHONY: images-tar
images-tar: ## Write the images (addon-heartbeat, pause, example addon) as OCI tarballs into bin/images, without a container engine (IMAGE_TAG=v0.2.0).
	$(GO) run ./hack/images -out bin/images -tag $${IMAGE_TAG:-v0.2.0}

.PHONY: release
release: ## Build release VERSION (such as v0.2.0) into dist/VERSION: multi-platform image index, packaged chart, SBOMs, notes, SHA256SUMS.
	@test -n "$(VERSION)" || { echo "make release: set VERSION, such as make release VERSION=v0.2.0"; exit 2; }
	@rm -rf dist/$(VERSION)
	$(GO) run ./hack/release -version $(VERSION) -out dist/$(VERSION)

.PHONY: e2e-node
e2e-node: ## Real-node end to end (root): a single-node cluster in its own network namespace, helm install, real pods heartbeating.
	@assets="$$(KUBE_VERSION=$(KUBE_VERSION) hack/kube-binaries.sh node | tail -n 1)" && helm="$$(hack/node-binaries.sh | tail -n 1)/helm" && \
	KUBEBUILDER_ASSETS="$$assets" HELM="$$helm" $(GO) test -tags node -count=1 -timeout 30m -v $(GOTESTFLAGS) ./test/node/
