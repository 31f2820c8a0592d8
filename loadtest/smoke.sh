#!/usr/bin/env bash
# Runs loadtest/smoke.js against a dev stack of its own: installs the pinned
# k6 when missing, starts the stack on loopback with a short session TTL,
# free ports and a temporary data dir (so it never meets a developer's
# `make run`), runs the smoke test, always stops the stack, and exits with
# k6's status. About a minute, plus a few the first time k6 is built.
#
# Any setting can be overridden from the environment: the stack's
# STILLTHERE_* (e.g. STILLTHERE_SESSION_TTL) and smoke.js's (CLIENTS,
# SILENT_FRACTION, PING_INTERVAL, GUIDE_BOUND, ...; see loadtest/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."

K6_VERSION=v1.8.1
K6_DIR=${K6_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/stillthere/k6-$K6_VERSION}
GO=${GO:-go}

log() { printf 'smoke: %s\n' "$*" >&2; }

# k6, built from the module proxy at the pinned version.
if command -v k6 >/dev/null && k6 version 2>/dev/null | grep -q "^k6 $K6_VERSION "; then
	K6=$(command -v k6)
elif [ -x "$K6_DIR/k6" ] && "$K6_DIR/k6" version 2>/dev/null | grep -q "^k6 $K6_VERSION "; then
	K6=$K6_DIR/k6
else
	log "building k6 $K6_VERSION into $K6_DIR (a few minutes, once)"
	mkdir -p "$K6_DIR"
	GOBIN=$K6_DIR "$GO" install "go.k6.io/k6@$K6_VERSION"
	K6=$K6_DIR/k6
fi

work=$(mktemp -d)
stack_pid=
stop() {
	status=$?
	if [ -n "$stack_pid" ] && kill -0 "$stack_pid" 2>/dev/null; then
		kill -TERM "$stack_pid" 2>/dev/null || true
		for _ in $(seq 100); do kill -0 "$stack_pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$stack_pid" 2>/dev/null || true
		wait "$stack_pid" 2>/dev/null || true
	fi
	if [ "$status" -ne 0 ] && [ -s "$work/stack.log" ]; then
		log "last lines of the stack's log:"
		tail -n 20 "$work/stack.log" >&2
	fi
	rm -rf "$work"
	exit "$status"
}
trap stop EXIT
trap 'exit 130' INT TERM

# The stack: every port picked by the kernel, read back from its banner.
export STILLTHERE_SESSION_TTL=${STILLTHERE_SESSION_TTL:-3s}
export STILLTHERE_SESSION_JITTER=${STILLTHERE_SESSION_JITTER:-1s}
# A fixed secret for this throwaway stack only; never a real deployment's.
export STILLTHERE_TOKEN_SECRET=${STILLTHERE_TOKEN_SECRET:-smoke-test-secret-for-loopback-only-0123456789}
export STILLTHERE_GATEWAY_ADDR=${STILLTHERE_GATEWAY_ADDR:-127.0.0.1:0}
export STILLTHERE_PUSH_ADDR=${STILLTHERE_PUSH_ADDR:-127.0.0.1:0}
export STILLTHERE_LISTENER_ADMIN_ADDR=${STILLTHERE_LISTENER_ADMIN_ADDR:-127.0.0.1:0}
export STILLTHERE_CONSUMER_ADMIN_ADDR=${STILLTHERE_CONSUMER_ADMIN_ADDR:-127.0.0.1:0}
export STILLTHERE_DEV_KAFKA_PORT=${STILLTHERE_DEV_KAFKA_PORT:-0}
export STILLTHERE_DEV_DATA_DIR=$work/data

log "building the dev stack"
"$GO" build -o "$work/dev" ./dev
"$work/dev" >"$work/stack.out" 2>"$work/stack.log" &
stack_pid=$!

push=
for _ in $(seq 600); do
	kill -0 "$stack_pid" 2>/dev/null || { log "the dev stack exited"; exit 1; }
	if [ -z "$push" ]; then
		line=$(grep -m1 '^  gateway ' "$work/stack.out" || true)
		gateway=$(sed -n 's|.*\(ws://[^ ]*\).*|\1|p' <<<"$line")
		push=$(sed -n 's|.*metrics: \(http://[^ ]*\).*|\1|p' <<<"$line")
	fi
	if [ -n "$push" ] && curl -fsS -o /dev/null "$push/readyz" 2>/dev/null; then
		break
	fi
	sleep 0.2
done
[ -n "$push" ] || { log "the dev stack did not come up within 2 minutes"; exit 1; }
log "stack up: gateway $gateway, session TTL $STILLTHERE_SESSION_TTL + jitter $STILLTHERE_SESSION_JITTER"

# Small and quick: pings every second to fit the short TTL. timeout bounds
# the run even if k6 itself hangs.
export GATEWAY_URL=$gateway
export CLIENTS=${CLIENTS:-200}
export SILENT_FRACTION=${SILENT_FRACTION:-0.25}
export PING_INTERVAL=${PING_INTERVAL:-1s}
export RAMP=${RAMP:-5s}
export GUIDE_BOUND=${GUIDE_BOUND:-3s}
export LINGER=${LINGER:-2s}
set +e
timeout --signal=INT --kill-after=30s 300s "$K6" run --no-usage-report --quiet --address "" loadtest/smoke.js
k6_status=$?
set -e
if [ "$k6_status" -eq 0 ]; then
	log "passed"
else
	log "FAILED (k6 exit status $k6_status)"
fi
exit "$k6_status"
