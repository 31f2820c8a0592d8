#!/usr/bin/env bash
# Lints and renders the chart with its default values and with every
# optional feature on (ci/*-values.yaml). Installs helm at the pinned
# version from the Go module proxy when it is missing.
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
helm lint "$chart"
helm template stillthere "$chart" >/dev/null
echo "rendered $chart with its default values"
for values in "$chart"/ci/*-values.yaml; do
	helm lint "$chart" -f "$values"
	helm template stillthere "$chart" -f "$values" >/dev/null
	echo "rendered $chart with $values"
done
