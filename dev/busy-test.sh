#!/usr/bin/env bash
# Runs a command, by default `make test`, on a host kept busy: a CPU hog
# on every core (stress-ng --cpu 1 each, or a shell busy loop where
# stress-ng is missing), as production hosts and shared CI runners are.
# The hogs stop when the command ends, however it ends; the script
# prints how long the command took and exits with its status.
#
#   dev/busy-test.sh                       # make test
#   dev/busy-test.sh go test -race ./pkg/devstack/
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
	set -- make test
fi

cores=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)
hogs=()
stop_hogs() {
	for pid in "${hogs[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${hogs[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	hogs=()
}
trap stop_hogs EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if command -v stress-ng >/dev/null 2>&1; then
	kind="stress-ng --cpu 1"
	for _ in $(seq "$cores"); do
		stress-ng --cpu 1 --quiet &
		hogs+=("$!")
	done
else
	kind="shell busy loops: stress-ng is not installed"
	for _ in $(seq "$cores"); do
		sh -c 'while :; do :; done' &
		hogs+=("$!")
	done
fi
echo "busy-test: $cores CPU hogs ($kind) while running: $*"

start=$(date +%s)
status=0
"$@" || status=$?
elapsed=$(($(date +%s) - start))
stop_hogs
printf 'busy-test: %s took %dm%02ds beside %d CPU hogs; exit status %d\n' \
	"$*" $((elapsed / 60)) $((elapsed % 60)) "$cores" "$status"
exit "$status"
