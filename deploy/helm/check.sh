#!/usr/bin/env bash
# Lints and renders the chart with each ci/*-values.yaml: the defaults
# with an existing Secret, and every optional feature on. Each renders
# twice to the same bytes, as a GitOps tool needs (a secret generated at
# render time would differ). The defaults alone must fail, naming the
# secrets to supply. Installs helm at the pinned version from the Go
# module proxy when it is missing. The canary's rules are rules.sh's.
set -euo pipefail
cd "$(dirname "$0")"

HELM_VERSION=v3.22.0
GOBIN="$(go env GOPATH)/bin"
export PATH="$GOBIN:$PATH"

if ! command -v helm >/dev/null 2>&1 || ! helm version --template '{{.Version}}' | grep -q "^${HELM_VERSION%.0}"; then
	echo "installing helm $HELM_VERSION into $GOBIN (a minute or two)"
	GOBIN="$GOBIN" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi

chart=stillthere
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# The default values supply no secret, and the chart generates none.
if helm template stillthere "$chart" >"$tmp/out" 2>"$tmp/err"; then
	echo "$chart rendered with its default values, which supply no secret: it must fail and name them" >&2
	exit 1
fi
if ! grep -q "secrets.existingSecret" "$tmp/err"; then
	echo "$chart without secrets failed without naming secrets.existingSecret:" >&2
	cat "$tmp/err" >&2
	exit 1
fi
echo "$chart refuses its default values alone: no secret given"

for values in "$chart"/ci/*-values.yaml; do
	helm lint "$chart" -f "$values"
	helm template stillthere "$chart" -f "$values" >"$tmp/first"
	helm template stillthere "$chart" -f "$values" >"$tmp/second"
	if ! diff -u "$tmp/first" "$tmp/second" >&2; then
		echo "$chart with $values renders differently twice: a GitOps sync would change it every time" >&2
		exit 1
	fi
	echo "rendered $chart with $values, twice the same"
done

