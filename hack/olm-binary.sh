#!/usr/bin/env bash
# Builds OLM's operator binary (`olm`, github.com/operator-framework/operator-lifecycle-manager)
# from the Go module proxy, for the end-to-end test that installs an addon from a
# ClusterServiceVersion (test/e2e/olm_test.go), and puts OLM's CRDs beside it:
#
#   <cache>/bin/olm-<version>/olm
#   <cache>/bin/olm-<version>/crds/*.yaml    (the module's deploy/chart/crds/)
#
# The folder is outside the checkout, keyed by version, so that fresh clones
# reuse it; an existing, complete folder is left alone. About 4 minutes on 2
# cores the first time, seconds once the Go build cache is warm.
#
# OLM builds as its own main module (its go.mod's replace directives must
# apply), so the module folder is copied to a writable place and built there.
#
# One change is made to the copy: OLM's health and metrics server listens on
# ":8080" (every interface, a fixed port) with no flag to change it; the copy
# listens on "127.0.0.1:0" instead (loopback, a free port), so that a test run
# opens nothing beyond loopback and two OLMs (or anything else on 8080) never
# collide. Nothing in the tests reads that server; the operator is unchanged.
#
# Prints the folder as the last line on stdout.
set -euo pipefail

OLM_VERSION="${OLM_VERSION:-v0.33.0}"
module=github.com/operator-framework/operator-lifecycle-manager
cache="${ADDON_HEARTBEAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/addon-heartbeat}"
out="${cache}/bin/olm-${OLM_VERSION}"
src="${cache}/src/operator-lifecycle-manager-${OLM_VERSION}"

log() { echo "olm-binary: $*" >&2; }

mkdir -p "${out}"

if [[ ! -x "${out}/olm" || ! -d "${out}/crds" ]]; then
	log "downloading ${module}@${OLM_VERSION} through the Go module proxy"
	info="$(cd / && GOFLAGS=-mod=mod go mod download -json "${module}@${OLM_VERSION}")"
	moddir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"${info}")"
	commit="$(sed -n 's/^[[:space:]]*"Hash": "\(.*\)",\{0,1\}$/\1/p' <<<"${info}" | head -n 1)"
	if [[ -z "${moddir}" || ! -d "${moddir}/cmd/olm" ]]; then
		log "go mod download gave no module folder with cmd/olm:"
		echo "${info}" >&2
		exit 1
	fi

	rm -rf "${src}"
	mkdir -p "$(dirname "${src}")"
	cp -r "${moddir}" "${src}"
	chmod -R u+w "${src}"
	server="${src}/pkg/lib/server/server.go"
	if ! grep -q 'return ":8080"' "${server}"; then
		log "${server} no longer listens on \":8080\": review the loopback change for ${OLM_VERSION}"
		exit 1
	fi
	sed -i -e 's/return ":8080"/return "127.0.0.1:0"/' -e 's/return ":8443"/return "127.0.0.1:0"/' "${server}"

	log "building olm ${OLM_VERSION}: about 4 minutes on 2 cores the first time, seconds once the Go build cache is warm"
	start=${SECONDS}
	ldflags="-s -w -X ${module}/pkg/version.OLMVersion=${OLM_VERSION} -X ${module}/pkg/version.GitCommit=${commit:-unknown}"
	# As OLM's own Makefile builds it: static, with the json1 tag.
	(cd "${src}" && CGO_ENABLED=0 go build -mod=readonly -trimpath -tags json1 -ldflags "${ldflags}" -o "${out}/olm.tmp" ./cmd/olm)
	log "built in $((SECONDS - start))s"

	rm -rf "${out}/crds.tmp"
	cp -r "${src}/deploy/chart/crds" "${out}/crds.tmp"
	rm -rf "${out}/crds"
	mv "${out}/crds.tmp" "${out}/crds"
	mv "${out}/olm.tmp" "${out}/olm"
	rm -rf "${src}"
	rmdir "$(dirname "${src}")" 2>/dev/null || true
fi

echo "${out}"
