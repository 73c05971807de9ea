#!/usr/bin/env bash
# make test-matrix: runs every test package that starts an API server (the
# envtest suites and test/e2e) once per Kubernetes release of KUBE_MATRIX, each
# against that release's kube-apiserver (built once by hack/kube-binaries.sh,
# about 15 minutes on 2 cores, then cached), and says at the end how each
# release went. The packages are found, not listed: those whose tests import
# internal/testenv, directly or not; and the SDK's module (pkg/heartbeat), whose
# tests start theirs through heartbeattest.
#
#   KUBE_MATRIX="v1.30.14 v1.33.13 v1.37.2" hack/test-matrix.sh
#
# The test binaries are the ones `make test` builds (same flags, -race), so
# after it only the runs cost time: about 8 minutes per release on 2 cores.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

read -r -a releases <<<"${KUBE_MATRIX:?set KUBE_MATRIX to Kubernetes versions such as \"v1.30.14 v1.37.2\"}"
module="$(go list -m)"
mapfile -t packages < <(go list -test -f '{{if .ForTest}}{{.ForTest}}{{range .Deps}} {{.}}{{end}}{{end}}' ./... |
	awk -v dep="${module}/internal/testenv" '{ for (i = 2; i <= NF; i++) if ($i == dep) { print $1; next } }' | sort -u)
if ((${#packages[@]} == 0)); then
	echo "test-matrix: no test package imports ${module}/internal/testenv" >&2
	exit 1
fi
olm="$(hack/olm-binary.sh | tail -n 1)"

log() { echo "test-matrix: $*" >&2; }
summary=()
failed=0
for release in "${releases[@]}"; do
	start=${SECONDS}
	assets="$(KUBE_VERSION="${release}" hack/kube-binaries.sh | tail -n 1)"
	# The folder is named after the release; the binary must say so too.
	got="$("${assets}/kube-apiserver" --version)"
	if [[ "${got}" != "Kubernetes ${release}" ]]; then
		log "${assets}/kube-apiserver says \"${got}\", not Kubernetes ${release}: remove the folder and build it again"
		exit 1
	fi
	log "Kubernetes ${release}: ${#packages[@]} packages and the SDK module"
	# shellcheck disable=SC2086 # GOTESTFLAGS is a list of flags
	if KUBE_VERSION="${release}" KUBEBUILDER_ASSETS="${assets}" OLM_ASSETS="${olm}" \
		go test -race -count=1 ${GOTESTFLAGS:-} "${packages[@]}" &&
		(cd pkg/heartbeat && KUBEBUILDER_ASSETS="${assets}" go test -race -count=1 ${GOTESTFLAGS:-} ./...); then
		summary+=("Kubernetes ${release}: ok ($((SECONDS - start))s)")
	else
		summary+=("Kubernetes ${release}: FAILED ($((SECONDS - start))s)")
		failed=1
	fi
done
printf 'test-matrix: %s\n' "${summary[@]}" >&2
exit "${failed}"
