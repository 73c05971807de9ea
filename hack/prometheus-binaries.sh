#!/usr/bin/env bash
# Builds the Prometheus server and promtool (github.com/prometheus/prometheus,
# pinned in hack/tools/prometheus) for the tests that run Prometheus' own code on
# the chart's monitoring objects: `promtool check rules` and `promtool test rules`
# on the PrometheusRule (test/chart), and a real Prometheus scraping the webhook
# and the reporters with those rules loaded (test/e2e):
#
#   <cache>/bin/prometheus-<version>/prometheus
#   <cache>/bin/prometheus-<version>/promtool
#
# The folder is outside the checkout, keyed by version, so that fresh clones
# reuse it; an existing, complete folder is left alone. The tests give the
# server static and file targets only, so it is built with the remove_all_sd
# tag (Prometheus' own switch) and links none of the cloud service discovery
# SDKs. About 11 CPU-minutes the first time, 6 to 7 minutes on two idle cores
# (README, Monitoring and alerts), 30 s once the Go build cache is warm.
#
# Prints the folder as the last line on stdout.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="${root}/hack/tools/prometheus"
module=github.com/prometheus/prometheus
PROMETHEUS_VERSION="$(cd "${tools}" && go list -m -f '{{.Version}}' "${module}")"
cache="${ADDON_HEARTBEAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/addon-heartbeat}"
out="${cache}/bin/prometheus-${PROMETHEUS_VERSION}"

log() { echo "prometheus-binaries: $*" >&2; }

mkdir -p "${out}"
if [[ ! -x "${out}/prometheus" || ! -x "${out}/promtool" ]]; then
	log "building prometheus and promtool ${PROMETHEUS_VERSION}: 6 to 7 minutes on 2 cores the first time, 30 s once the Go build cache is warm"
	start=${SECONDS}
	# Prometheus' VERSION file says 3.x for the module's v0.3xx tags.
	(cd "${tools}" && go mod download "${module}")
	moddir="$(cd "${tools}" && go list -m -f '{{.Dir}}' "${module}")"
	if [[ -z "${moddir}" || ! -f "${moddir}/VERSION" ]]; then
		log "no VERSION file in the module folder of ${module}@${PROMETHEUS_VERSION} (${moddir:-not found})"
		exit 1
	fi
	version="$(cat "${moddir}/VERSION")"
	ldflags="-s -w -X github.com/prometheus/common/version.Version=${version} -X github.com/prometheus/common/version.Revision=${PROMETHEUS_VERSION} -X github.com/prometheus/common/version.Branch=module"
	for cmd in promtool prometheus; do
		(cd "${tools}" && CGO_ENABLED=0 go build -mod=readonly -trimpath -tags remove_all_sd -ldflags "${ldflags}" -o "${out}/${cmd}.tmp" "${module}/cmd/${cmd}")
		mv "${out}/${cmd}.tmp" "${out}/${cmd}"
	done
	log "built in $((SECONDS - start))s"
fi

echo "${out}"
