#!/usr/bin/env bash
# Tests the canary's recording rules and burn-rate alerts, as
# ci/canary-values.yaml renders them, with promtool test rules
# (canary-rules-test.yaml): they stay quiet on a healthy canary and fire
# on a stopped consumer. Installs promtool at the pinned version from the
# Go module proxy when it is missing; "rules.sh install" only installs it.
# promtool is built from the prometheus module (its v0.3xx.y tags are
# Prometheus 3.x.y): the first build takes minutes on two cores, so
# CI starts it in the background before the tests (.ci/run).
set -euo pipefail
cd "$(dirname "$0")"

PROMTOOL_VERSION=v0.316.0
GOBIN="$(go env GOPATH)/bin"
export PATH="$GOBIN:$PATH"

# One install at a time: CI starts one in the background, and make test's
# rules step may reach here while it builds; the second waits for it.
mkdir -p "$GOBIN"
exec 9>"$GOBIN/.promtool-install.lock"
if ! flock -n 9; then
	# The install that holds the lock may have been started niced, to use
	# what the tests left idle. This step waits for it now: it runs at this
	# step's priority from here on (where allowed; a busy host starves a
	# build at nice 19 for as long as the host stays busy).
	holder="$(cat "$GOBIN/.promtool-install.pid" 2>/dev/null || true)"
	descendants() {
		local p
		for p in $(pgrep -P "$1" 2>/dev/null); do
			echo "$p"
			descendants "$p"
		done
	}
	if [ -n "$holder" ] && kill -0 "$holder" 2>/dev/null; then
		renice -n "$(nice)" -p "$holder" $(descendants "$holder") >/dev/null 2>&1 || true
	fi
	flock 9
fi
echo $$ >"$GOBIN/.promtool-install.pid"
if ! command -v promtool >/dev/null 2>&1 || ! go version -m "$(command -v promtool)" | grep -q "mod[[:space:]]*github.com/prometheus/prometheus[[:space:]]*$PROMTOOL_VERSION"; then
	echo "installing promtool $PROMTOOL_VERSION into $GOBIN (a few minutes, the first time)"
	# Without the service discoveries (their cloud SDKs are most of the
	# build): rule tests need none.
	GOBIN="$GOBIN" go install -tags remove_all_sd "github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION"
fi
flock -u 9
if [ "${1:-}" = install ]; then
	exit 0
fi

chart=stillthere
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# The rule file Prometheus gets: the PrometheusRule's spec, its groups.
helm template stillthere "$chart" -f "$chart/ci/canary-values.yaml" --namespace chat \
	--show-only templates/prometheusrule.yaml | sed -n '/^spec:/,$p' | sed '1d; s/^  //' >"$tmp/rules.yaml"
cp canary-rules-test.yaml "$tmp/"
promtool check rules "$tmp/rules.yaml"
(cd "$tmp" && promtool test rules canary-rules-test.yaml)
echo "the canary's rules fire on a stopped consumer and stay quiet on a healthy one"
