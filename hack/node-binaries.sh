#!/usr/bin/env bash
# Builds and installs what the real-node end-to-end test (make e2e-node) runs
# besides the Kubernetes and etcd binaries of hack/kube-binaries.sh:
#  - the Helm CLI (helm.sh/helm/v4, pinned in hack/tools/helm), built into a
#    cache folder outside the checkout keyed by its version, reused afterwards;
#  - containerd, runc and the CNI plugins from the distribution's packages
#    (Debian: containerd, runc, containernetworking-plugins), when missing;
#  - qemu-user (Debian: qemu-user, without qemu-user-binfmt, so that the
#    host's binfmt_misc is left alone), which runs the release's arm64
#    binaries, when missing.
#
# Prints the Helm folder as the last line on stdout.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HELM_VERSION="$(cd "${root}/hack/tools/helm" && go list -m -f '{{.Version}}' helm.sh/helm/v4)"
cache="${ADDON_HEARTBEAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/addon-heartbeat}"
out="${cache}/bin/helm-${HELM_VERSION}"

log() { echo "node-binaries: $*" >&2; }

mkdir -p "${out}"
if [[ ! -x "${out}/helm" ]]; then
	log "building the helm ${HELM_VERSION} CLI (a few minutes the first time)"
	ldflags="-X helm.sh/helm/v4/internal/version.version=${HELM_VERSION} -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
	(cd "${root}/hack/tools/helm" && CGO_ENABLED=0 go build -ldflags "${ldflags}" -o "${out}/helm.tmp" helm.sh/helm/v4/cmd/helm)
	mv "${out}/helm.tmp" "${out}/helm"
fi

missing=()
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] || missing+=(containernetworking-plugins)
command -v qemu-aarch64 >/dev/null || command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user)
if ((${#missing[@]})); then
	if ! command -v apt-get >/dev/null; then
		log "missing ${missing[*]} and no apt-get: install containerd (1.6+), runc, the CNI plugins (in /usr/lib/cni) and qemu-user (qemu-aarch64)"
		exit 1
	fi
	log "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

echo "${out}"
