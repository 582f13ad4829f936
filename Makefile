# Switchyard — run `make` for the list of targets.
SHELL := /bin/bash
GO    ?= go
BIN   := bin
# Tool versions are pinned here and installed into $(BIN) by the targets that need them.
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := $(BIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
BENCHTIME ?= 1s
FUZZTIME  ?= 10s
# The nemesis soak (docs/testing.md): one seed, this long, these fault kinds.
NEMESIS_DURATION ?= 30m
NEMESIS_SEED     ?= 1
NEMESIS_FAULTS   ?= crash,nats_cut,etcd_restart,slow_actor,clock_skew,life_drop,life_duplicate,owner_nats_cut,entry_nats_cut,etcd_cut_one,gossip_cut_one
NEMESIS_FLAGS    ?=

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build the switchyard binary into bin/.
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/switchyard ./cmd/switchyard

.PHONY: up
up: ## Start a local cluster (embedded etcd + NATS, 3 routers, 8 simulated workers) on 127.0.0.1:8080; UP_FLAGS="-protocol vllm" puts each worker behind an adapter.
	@echo "Building $(BIN)/switchyard (the first build takes minutes; later ones are cached)..."
	@CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/switchyard ./cmd/switchyard
	@# exec: Ctrl-C reaches the binary itself, whose normal stop exits 0
	@# (`go run` exits 1 when interrupted, whatever the program returns).
	@exec $(BIN)/switchyard up $(UP_FLAGS)

.PHONY: test
test: ## Run every test with the race detector (fuzz targets run their seed corpora).
	$(GO) test -race -count=1 -timeout 30m ./...

.PHONY: nemesis
nemesis: ## Soak the randomized fault test: NEMESIS_DURATION=30m NEMESIS_SEED=1 NEMESIS_FAULTS=all (progress line, final table).
	cd internal/app && $(GO) test -count=1 -timeout 0 -run '^TestNemesis$$' -args \
	  -nemesis.seed=$(NEMESIS_SEED) -nemesis.duration=$(NEMESIS_DURATION) -nemesis.faults=$(NEMESIS_FAULTS) \
	  -nemesis.progress=5s $(NEMESIS_FLAGS)

.PHONY: nemesis-ci
nemesis-ci: ## Run the nemesis's CI seeds (1,2,3; 20 s each) under the race detector.
	$(GO) test -race -count=1 -timeout 15m -run '^TestNemesis$$' ./internal/app/ -args -nemesis.seeds=1,2,3

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 10s).
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; done

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run go vet, golangci-lint (gofmt/goimports), the dependency rules, and fail on an untidy go.mod.
	$(GO) mod tidy -diff
	$(GO) vet ./...
	$(GOLANGCI_LINT) run ./...
	./scripts/depcheck.sh

$(GOLANGCI_LINT):
	@mkdir -p $(BIN)
	GOBIN=$(abspath $(BIN))/tmp-golangci $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(BIN)/tmp-golangci/golangci-lint $@ && rmdir $(BIN)/tmp-golangci

.PHONY: bench
bench: ## Run the Go benchmarks of every hot path (BENCHTIME=1s).
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./...

.PHONY: e2e
e2e: ## Run the docker-compose end-to-end suite (needs Docker).
	./e2e/run.sh

.PHONY: e2e-pd
e2e-pd: ## Run only the disaggregated prefill/decode compose variant (needs Docker).
	E2E_VARIANT=pd ./e2e/run.sh

.PHONY: clean
clean: ## Remove build outputs.
	rm -rf $(BIN)
