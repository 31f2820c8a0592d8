#!/usr/bin/env bash
# Lints and renders the chart with each ci/*-values.yaml: the defaults
# with an existing Secret, and every optional feature on. Each renders
# twice to the same bytes, as a GitOps tool needs (a secret generated at
# render time would differ). The defaults alone must fail, naming the
# secrets to supply. Then tests the canary's recording rules and burn-rate
# alerts, as ci/canary-values.yaml renders them, with promtool test rules
# (canary-rules-test.yaml). Installs helm and promtool at the pinned
# versions from the Go module proxy when they are missing.
set -euo pipefail
cd "$(dirname "$0")"

HELM_VERSION=v3.22.0
# promtool is built from the prometheus module (its v0.3xx.y tags are
# Prometheus 3.x.y): the first build takes several minutes.
PROMTOOL_VERSION=v0.316.0
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

if ! command -v promtool >/dev/null 2>&1 || ! go version -m "$(command -v promtool)" | grep -q "mod[[:space:]]*github.com/prometheus/prometheus[[:space:]]*$PROMTOOL_VERSION"; then
	echo "installing promtool $PROMTOOL_VERSION into $GOBIN (several minutes, the first time)"
	GOBIN="$GOBIN" go install "github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION"
fi
# The rule file Prometheus gets: the PrometheusRule's spec, its groups.
helm template stillthere "$chart" -f "$chart/ci/canary-values.yaml" --namespace chat \
	--show-only templates/prometheusrule.yaml | sed -n '/^spec:/,$p' | sed '1d; s/^  //' >"$tmp/rules.yaml"
cp canary-rules-test.yaml "$tmp/"
promtool check rules "$tmp/rules.yaml"
(cd "$tmp" && promtool test rules canary-rules-test.yaml)
echo "the canary's rules fire on a stopped consumer and stay quiet on a healthy one"
