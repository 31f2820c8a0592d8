#!/usr/bin/env bash
# Every package's tests with -race, as make test runs them, the gateway's
# suite twice: in epoll mode (Linux's) and with a goroutine per
# connection (the read mode of other platforms).
#
# The gateway's suite spends nearly all its time waiting on a real
# Redis's TTLs and deadlines (a few percent of a core), so its two runs
# go beside the other packages instead of after them: on two cores that
# is about a quarter of an hour less, at the cost of a busier machine,
# which every test must bear anyway. Each run's output comes when it
# ends, its lines marked with the run; any failure fails the script.
#
#   dev/gotest.sh                  # what make test runs
#   GO=go1.27 dev/gotest.sh
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

# The dev stack's and the listener's packages run about 10 minutes beside
# CPU hogs: more than go test's default limit per package.
flags=(-race -count=1 -timeout 25m)
gateway=./pkg/gateway/

mapfile -t others < <("$GO" list ./... | grep -vx "$("$GO" list "$gateway")")
if [ "${#others[@]}" -eq 0 ]; then
	echo "go list found no packages" >&2
	exit 1
fi

# mode runs the gateway's suite in read mode $1, each line marked.
mode() {
	STILLTHERE_READ_MODE=$1 "$GO" test "${flags[@]}" "$gateway" 2>&1 | sed -u "s/^/[gateway, $1 mode] /"
	return "${PIPESTATUS[0]}"
}
mode epoll &
epoll=$!
mode goroutine &
goroutine=$!

STILLTHERE_REQUIRE_HELM=1 "$GO" test "${flags[@]}" "${others[@]}"
rc=$?
wait "$epoll" || rc=1
wait "$goroutine" || rc=1
exit "$rc"
