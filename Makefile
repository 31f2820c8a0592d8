GO ?= go
# Fuzzing is bounded by a count of inputs, not by time: with a duration,
# Go 1.26's fuzz coordinator can fail a target that found nothing, with
# "context deadline exceeded", when the deadline races a busy worker
# (go.dev/issue/75804, fixed in Go 1.27). 50000 inputs take 1-6 s each here.
FUZZTIME ?= 50000x
# The targets that write, open and sync a spool's files for every input
# run at tens to hundreds of inputs a second, not thousands: 50000 took
# about 5 minutes each on a fresh machine. They get fewer inputs.
FUZZ_FILE_TARGETS = FuzzOpenRecovery FuzzDamageBeforeFrames
FUZZTIME_FILES ?= 1000x

.DEFAULT_GOAL := help
.PHONY: help run test test-busy fuzz lint bench bench-smoke deps smoke chart web rules nemesis nemesis-ci

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

run: deps ## run the whole pipeline: redis-server, embedded Kafka, the three services
	$(GO) run ./dev

test: deps ## vet, lint and render the chart, every test with -race, short fuzzing, the k6 smoke test, the browser tests, the canary's alert rules, the benchmark at small scale (about 30 minutes on two cores)
	# Each stage's steps run together, each step's output when it ends
	# (-O). Lint and the chart mostly build (staticcheck, helm) and
	# download modules.
	$(MAKE) --no-print-directory -j2 -O lint chart
	# Every package with -race, the gateway's suite in both read modes
	# beside the others (dev/gotest.sh says why).
	PATH="$$($(GO) env GOPATH)/bin:$$PATH" GO=$(GO) ./dev/gotest.sh
	# Fuzzing keeps both cores busy; the rest mostly wait on stacks of
	# their own: k6, a browser, promtool, the benchmark's processes.
	$(MAKE) --no-print-directory -j5 -O fuzz smoke web rules bench-smoke

test-busy: ## make test beside a CPU hog on every core (dev/busy-test.sh: stress-ng, or shell busy loops), stopped after; prints how long it took
	./dev/busy-test.sh $(MAKE) --no-print-directory test

fuzz: ## run each fuzz target for FUZZTIME (default 50000x: inputs, not seconds); the spool's file-writing ones for FUZZTIME_FILES (1000x)
	@grep -rlE '^func Fuzz' --include='*_test.go' . | sort | while read -r file; do \
		dir=$$(dirname "$$file"); \
		for target in $$(grep -oE '^func Fuzz[A-Za-z0-9_]+' "$$file" | sed 's/^func //'); do \
			n=$(FUZZTIME); \
			case " $(FUZZ_FILE_TARGETS) " in *" $$target "*) n=$(FUZZTIME_FILES);; esac; \
			echo "fuzz $$dir $$target ($$n)"; \
			$(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $$n "$$dir" || exit 1; \
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

bench: deps ## benchmark into bench/report.md and report.json (about 12 min), then micro-benchmarks; QUICK=1: small scale, about 6 min, no micro-benchmarks
	$(GO) build -o bin/ $(BENCH_CMDS)
	bin/bench -bin bin -out $(BENCH_OUT) $(if $(QUICK),-quick)
	$(if $(QUICK),,$(GO) test -run '^$$' -bench . -benchmem -count 1 ./pkg/... | tee bench/micro.txt)

bench-smoke: deps ## the benchmark at small scale as a smoke test, as make test runs it: fails on a lost or doubled guide or a failed step, never on timing; its report goes to a temporary directory, not over bench/
	@out=$$(mktemp -d) && \
		$(MAKE) --no-print-directory bench QUICK=1 BENCH_OUT="$$out" && \
		test -s "$$out/report.md" && test -s "$$out/report.json" && \
		echo "bench-smoke: the report is in $$out" || { echo "bench-smoke: failed; its report, if any, is in $$out"; exit 1; }

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
