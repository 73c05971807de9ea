#!/usr/bin/env bash
# Builds the Kubernetes and etcd binaries that envtest, `make demo` and the
# real-node e2e run, from the Go module proxy (no download bucket needed).
# Output goes to a cache folder outside the checkout, keyed by version, so that
# fresh clones reuse it; an existing, complete folder is left alone.
#
# Prints the folder (for KUBEBUILDER_ASSETS) as the last line on stdout.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${ADDON_HEARTBEAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/addon-heartbeat}"
out="${cache}/bin/k8s-${KUBE_VERSION}-etcd-${ETCD_VERSION}"

log() { echo "kube-binaries: $*" >&2; }

mkdir -p "${out}"

if [[ ! -x "${out}/kube" ]]; then
	log "building kube-apiserver, kube-controller-manager, kube-scheduler and kubelet ${KUBE_VERSION} as one binary"
	log "this takes about 15 minutes on 2 cores the first time, seconds once the Go build cache is warm"
	major="${KUBE_VERSION#v}"; major="${major%%.*}"
	minor="${KUBE_VERSION#v*.}"; minor="${minor%%.*}"
	ldflags=""
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X ${pkg}.gitVersion=${KUBE_VERSION} -X ${pkg}.gitMajor=${major} -X ${pkg}.gitMinor=${minor}"
		ldflags+=" -X ${pkg}.gitCommit=0000000000000000000000000000000000000000 -X ${pkg}.gitTreeState=clean"
		ldflags+=" -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
	done
	(cd "${root}/hack/tools/kube" && go build -ldflags "${ldflags}" -o "${out}/kube.tmp" .)
	mv "${out}/kube.tmp" "${out}/kube"
fi
for name in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
	ln -sfn kube "${out}/${name}"
done

if [[ ! -x "${out}/etcd" ]]; then
	log "building etcd ${ETCD_VERSION} (about a minute the first time)"
	(cd "${root}/hack/tools/etcd" && go build -o "${out}/etcd.tmp" go.etcd.io/etcd/server/v3)
	mv "${out}/etcd.tmp" "${out}/etcd"
fi

echo "${out}"
