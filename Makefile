GO ?= go
# Fuzzing is bounded by a count of inputs, not by time: with a duration,
# Go 1.26's fuzz coordinator can fail a target that found nothing, with
# "context deadline exceeded", when the deadline races a busy worker
# (go.dev/issue/75804, fixed in Go 1.27). 50000 inputs take 1-6 s each here.
FUZZTIME ?= 50000x

.DEFAULT_GOAL := help
.PHONY: help run test test-busy fuzz lint bench deps smoke chart web nemesis nemesis-ci

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

run: deps ## run the whole pipeline: redis-server, embedded Kafka, the three services
	$(GO) run ./dev

test: deps lint chart ## vet, lint and render the chart, every test with -race, short fuzzing, the k6 smoke test, the browser tests, the canary's alert rules
	# The dev stack's package runs about 10 minutes beside CPU hogs: more
	# than go test's default limit per package.
	STILLTHERE_REQUIRE_HELM=1 PATH="$$($(GO) env GOPATH)/bin:$$PATH" $(GO) test -race -count=1 -timeout 25m ./...
	# The gateway's suite again with a goroutine per connection, the read
	# mode of other platforms (the run above is in epoll mode, Linux's).
	STILLTHERE_READ_MODE=goroutine $(GO) test -race -count=1 ./pkg/gateway/
	$(MAKE) --no-print-directory fuzz
	$(MAKE) --no-print-directory smoke
	$(MAKE) --no-print-directory web
	$(MAKE) --no-print-directory rules

test-busy: ## make test beside a CPU hog on every core (dev/busy-test.sh: stress-ng, or shell busy loops), stopped after; prints how long it took
	./dev/busy-test.sh $(MAKE) --no-print-directory test

fuzz: ## run each fuzz target for FUZZTIME (default 50000x: inputs, not seconds)
	@grep -rlE '^func Fuzz' --include='*_test.go' . | sort | while read -r file; do \
		dir=$$(dirname "$$file"); \
		for target in $$(grep -oE '^func Fuzz[A-Za-z0-9_]+' "$$file" | sed 's/^func //'); do \
			echo "fuzz $$dir $$target"; \
			$(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) "$$dir" || exit 1; \
		done; \
	done

# staticcheck, pinned; go run builds it from the Go module proxy the first
# time, then from the build cache.
STATICCHECK_VERSION = v0.8.2

lint: ## gofmt, go vet and staticcheck (pinned, built the first time)
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

# The benchmark's programs, and where its report goes.
BENCH_CMDS = ./gateway ./loadtest/wsload ./loadtest/guidebench ./loadtest/bench ./loadtest/detectbench ./loadtest/outagebench ./loadtest/activitybench
BENCH_OUT ?= bench

bench: deps ## benchmark into bench/report.md and report.json (about 12 min), then micro-benchmarks; QUICK=1: small scale, about 3 min, no micro-benchmarks
	$(GO) build -o bin/ $(BENCH_CMDS)
	bin/bench -bin bin -out $(BENCH_OUT) $(if $(QUICK),-quick)
	$(if $(QUICK),,$(GO) test -run '^$$' -bench . -benchmem -count 1 ./pkg/... | tee bench/micro.txt)

# The fault-schedule suite's length and seed: a number replays a schedule,
# "random" draws one (printed first).
DURATION ?= 3m
SEED ?= 1
NEMESIS_CMDS = ./gateway ./expiry-listener ./guide-consumer ./loadtest/nemesis

nemesis: deps ## fault-schedule suite (DURATION=3m, SEED=1 or random) into bench/nemesis.md; fails on any lost, false, duplicated, disordered or spam stage, or a path never reached
	$(GO) build -o bin/ $(NEMESIS_CMDS)
	bin/nemesis -bin bin -seed $(SEED) -duration $(DURATION) -out bench/nemesis.md

nemesis-ci: deps ## the fault-schedule suite as CI runs it: seed 1, then a random seed, 2 minutes each (about 8 in all); reports in the temporary directory
	$(GO) build -o bin/ $(NEMESIS_CMDS)
	bin/nemesis -bin bin -seed 1 -duration 2m -out $${TMPDIR:-/tmp}/nemesis-ci-fixed.md
	bin/nemesis -bin bin -seed random -duration 2m -out $${TMPDIR:-/tmp}/nemesis-ci-random.md

smoke: deps ## k6 smoke test (loadtest/smoke.js) against a dev stack of its own; builds the pinned k6 once
	./loadtest/smoke.sh

web: deps ## the JavaScript client's unit tests (Node) and the demo page in headless Chromium (web/test.sh); installs chromium and the pinned test packages when missing
	./web/test.sh

deps: ## install redis-server when it is missing (Debian), or say how
	@./dev/ensure-redis.sh

chart: ## helm lint and template of deploy/helm/stillthere with each ci values file, twice the same; the defaults alone must fail (installs helm when missing)
	./deploy/helm/check.sh

rules: ## promtool test rules of the canary's SLO alerts, and the canary's burn-rate alert firing on a stopped consumer in the dev stack (installs promtool when missing: a few minutes the first time)
	./deploy/helm/rules.sh
	STILLTHERE_REQUIRE_PROMTOOL=1 PATH="$$($(GO) env GOPATH)/bin:$$PATH" $(GO) test -race -count=1 -run '^TestCanaryConsumerStopped$$' ./pkg/devstack/
