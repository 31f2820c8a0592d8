GO ?= go
FUZZTIME ?= 3s

.DEFAULT_GOAL := help
.PHONY: help run test fuzz lint bench deps

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

run: deps ## run the whole pipeline: redis-server, embedded Kafka, the three services
	$(GO) run ./dev

test: deps lint ## vet, run every test with -race, then a short run of every fuzz target
	$(GO) test -race -count=1 ./...
	$(MAKE) --no-print-directory fuzz

fuzz: ## run each fuzz target for FUZZTIME (default 3s)
	@grep -rlE '^func Fuzz' --include='*_test.go' . | sort | while read -r file; do \
		dir=$$(dirname "$$file"); \
		for target in $$(grep -oE '^func Fuzz[A-Za-z0-9_]+' "$$file" | sed 's/^func //'); do \
			echo "fuzz $$dir $$target"; \
			$(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) "$$dir" || exit 1; \
		done; \
	done

lint: ## gofmt and go vet
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

bench: deps ## micro-benchmarks into bench/report.md (the load benchmark comes with the load-test work)
	@mkdir -p bench
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./... | tee bench/raw.txt
	@{ echo "# stillthere micro-benchmarks"; echo; echo "Machine: $$(uname -srm), $$(nproc) cores, $$(go version | cut -d' ' -f3)"; \
	   echo; echo "Command: \`make bench\`"; echo; echo '```'; grep -E '^(Benchmark|goos|goarch|cpu|pkg)' bench/raw.txt; echo '```'; } > bench/report.md
	@echo "wrote bench/report.md"

deps: ## install redis-server when it is missing (Debian), or say how
	@./dev/ensure-redis.sh
