#!/usr/bin/env bash
# Builds the Kubernetes and etcd binaries that envtest, `make demo` and the
# real-node e2e run, from the Go module proxy (no download bucket needed):
#
#   hack/kube-binaries.sh              kube-apiserver and etcd (make test, make demo)
#   hack/kube-binaries.sh node         also kubelet, kube-controller-manager and
#                                      kube-scheduler (make e2e-node)
#   KUBE_VERSION=v1.30.14 hack/kube-binaries.sh    another Kubernetes release
#
# Output goes to a cache folder outside the checkout, one per version
# (<cache>/bin/k8s-<kube version>-etcd-<etcd version>), so that fresh clones
# reuse it; binaries already there are left alone.
#
# Each release is built from a Go module of its own, hack/tools/kube-1.<minor>
# when its version is that release (written by hack/kube-module.sh, which says
# what the recipe is), otherwise one written into the cache the first time.
# `node` needs a checked-in module with a main.go: one binary holding the four
# commands (see hack/tools/kube-1.37/main.go).
#
# Prints the folder (for KUBEBUILDER_ASSETS) as the last line on stdout;
# progress goes to stderr.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
what="${1:-apiserver}"
case "${what}" in
apiserver | node) ;;
*)
	echo "usage: $0 [apiserver|node]: kube-apiserver and etcd (the default), or also the node's binaries" >&2
	exit 2
	;;
esac
if [[ ! "${KUBE_VERSION}" =~ ^v1\.([0-9]+)\.[0-9]+$ ]]; then
	echo "kube-binaries: KUBE_VERSION=${KUBE_VERSION} is not a Kubernetes release version such as v1.30.14" >&2
	exit 2
fi
minor="${BASH_REMATCH[1]}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${ADDON_HEARTBEAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/addon-heartbeat}"
out="${cache}/bin/k8s-${KUBE_VERSION}-etcd-${ETCD_VERSION}"

log() { echo "kube-binaries: $*" >&2; }

elapsed() { printf '%dm%02ds' $(((SECONDS - $1) / 60)) $(((SECONDS - $1) % 60)); }

# gobuild LABEL DIR OUTPUT [go build args...] builds in DIR into OUTPUT, with a
# progress line every 100 compiled packages and the time taken, since a cold
# build of Kubernetes compiles about 2,000 packages for 6 to 15 minutes.
gobuild() {
	local label="$1" dir="$2" output="$3" start=${SECONDS} total errors n=0 line
	shift 3
	# Listing the packages downloads the modules first, so that what follows
	# is all compiling.
	errors="$(mktemp)"
	if ! total="$(cd "${dir}" && go list -deps "${@: -1}" 2>"${errors}" | wc -l)"; then
		cat "${errors}" >&2
		rm -f "${errors}"
		return 1
	fi
	rm -f "${errors}"
	log "${label}: compiling up to ${total} packages (those already in the Go build cache are skipped; modules ready in $(elapsed "${start}"))"
	# go build -v names each package as it compiles it; any other line is a
	# compiler message, passed on.
	while IFS= read -r line; do
		if [[ "${line}" == kube-binaries-exit=* ]]; then
			break
		elif [[ "${line}" =~ ^[A-Za-z0-9._~/-]+$ ]]; then
			if ((++n % 100 == 0)); then
				log "${label}: compiled ${n} of at most ${total} packages ($(elapsed "${start}"))"
			fi
		else
			echo "${line}" >&2
		fi
	done < <(cd "${dir}" && go build -v -o "${output}.tmp" "$@" 2>&1; echo "kube-binaries-exit=$?")
	if [[ "${line}" != kube-binaries-exit=0 ]]; then
		log "${label}: go build failed"
		return 1
	fi
	mv "${output}.tmp" "${output}"
	log "${label}: built in $(elapsed "${start}")"
}

# The module: checked in for the matrix's releases, written into the cache for
# any other.
module="${root}/hack/tools/kube-1.${minor}"
pinned() { sed -n 's/^[[:space:]]*\(require[[:space:]]\{1,\}\)\{0,1\}k8s\.io\/kubernetes[[:space:]]\{1,\}\(v[^[:space:]]*\).*/\2/p' "$1/go.mod" 2>/dev/null; }
if [[ "$(pinned "${module}")" != "${KUBE_VERSION}" ]]; then
	module="${cache}/src/kube-${KUBE_VERSION}"
	if [[ ! -f "${module}/go.sum" ]]; then
		log "no module in hack/tools pins Kubernetes ${KUBE_VERSION}: writing one into ${module}"
		"${root}/hack/kube-module.sh" "${KUBE_VERSION}" "${module}"
	fi
fi

# No symbol table and no DWARF (-s -w): a quicker link and a third less disk;
# panics still print their stacks.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	# Without the version, kube-apiserver reports v0.0.0-master, which
	# version checks (Helm's kubeVersion, kubectl) refuse.
	ldflags+=" -X ${pkg}.gitVersion=${KUBE_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor}"
	ldflags+=" -X ${pkg}.gitCommit=0000000000000000000000000000000000000000 -X ${pkg}.gitTreeState=clean"
	ldflags+=" -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
done

mkdir -p "${out}"

if [[ ! -x "${out}/kube-apiserver" ]]; then
	log "building kube-apiserver ${KUBE_VERSION}: about 15 minutes on 2 cores the first time, seconds once the Go build cache is warm"
	gobuild "kube-apiserver ${KUBE_VERSION}" "${module}" "${out}/kube-apiserver" -ldflags "${ldflags}" k8s.io/kubernetes/cmd/kube-apiserver
fi

if [[ "${what}" == node && ! -x "${out}/kube" ]]; then
	if [[ ! -f "${module}/main.go" ]]; then
		log "the node's binaries are built for the releases whose module has a main.go (hack/tools/kube-1.*/main.go); ${module} has none"
		exit 1
	fi
	log "building kubelet, kube-controller-manager and kube-scheduler ${KUBE_VERSION} as one binary (kube): about 10 more minutes on 2 cores the first time"
	gobuild "kube ${KUBE_VERSION}" "${module}" "${out}/kube" -ldflags "${ldflags}" .
fi
if [[ "${what}" == node ]]; then
	for name in kube-controller-manager kube-scheduler kubelet; do
		ln -sfn kube "${out}/${name}"
	done
fi

if [[ ! -x "${out}/etcd" ]]; then
	# One etcd for every Kubernetes release: copied from another folder when
	# one has it.
	other="$(ls -d "${cache}"/bin/k8s-*-etcd-"${ETCD_VERSION}"/etcd 2>/dev/null | head -n 1 || true)"
	if [[ -n "${other}" && -x "${other}" ]]; then
		cp "${other}" "${out}/etcd.tmp" && mv "${out}/etcd.tmp" "${out}/etcd"
	else
		log "building etcd ${ETCD_VERSION} (about a minute the first time)"
		gobuild "etcd ${ETCD_VERSION}" "${root}/hack/tools/etcd" "${out}/etcd" go.etcd.io/etcd/server/v3
	fi
fi

echo "${out}"
