#!/usr/bin/env bash
# The JavaScript tests: the client library's unit tests on Node's test
# runner, then the demo page in headless Chromium and a type check of the
# library's declarations. Each test file starts a test stack of its own
# (web/teststack, built here once) on loopback. Installs what is missing:
# Chromium (Debian's package) and the test packages pinned in
# web/test/package-lock.json (playwright-core, typescript). About a
# minute. The screenshot and the guide's latency go to
# STILLTHERE_ARTIFACTS (default web/test/out).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

log() { printf 'web: %s\n' "$*" >&2; }

if ! command -v node >/dev/null 2>&1; then
	log "node is missing: install Node.js 20.10 or later (Debian: apt-get install nodejs npm)"
	exit 1
fi
./dev/ensure-chromium.sh

# npm ci again only when the lockfile changed since the last install.
if [ ! -f web/test/node_modules/.package-lock.json ] || [ web/test/package-lock.json -nt web/test/node_modules/.package-lock.json ]; then
	log "installing the test packages (npm ci)"
	(cd web/test && npm ci --no-audit --no-fund --loglevel=error)
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$GO" build -o "$work/teststack" ./web/teststack
export STILLTHERE_TESTSTACK=$work/teststack
export STILLTHERE_ARTIFACTS=${STILLTHERE_ARTIFACTS:-$PWD/web/test/out}

# Node 22 has WebSocket built in; Node 20 behind a flag.
ws_flag=$(node -e 'process.stdout.write(typeof WebSocket === "function" ? "" : "--experimental-websocket")')
# One file at a time: each starts a stack, and the machine may be small.
timeout --kill-after=30s 600s node $ws_flag --test --test-concurrency=1 \
	web/client/test/*.test.js web/test/*.test.js
log "artifacts in $STILLTHERE_ARTIFACTS"
