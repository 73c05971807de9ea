#!/usr/bin/env bash
# make test-stress: the time-sensitive packages, RUNS times in a row (default
# 10), with the race detector, while a CPU hog keeps every core busy, as a
# shared CI machine would. It prints one line per run and the count passed,
# keeps the output of failed runs, and fails if any run failed.
#
# The hog is one busy loop per core at the tests' own priority; each loop is
# bounded by a timeout and all are killed when this script ends, however it
# ends.
set -euo pipefail

RUNS="${RUNS:-10}"
PKGS="${STRESS_PKGS:-github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat ./internal/reporter ./test/e2e}"
: "${KUBEBUILDER_ASSETS:?set KUBEBUILDER_ASSETS (make test-stress does)}"
out="$(mktemp -d "${TMPDIR:-/tmp}/addon-heartbeat-stress.XXXXXX")"

# Compile first, without the hog, so that each run measures the tests.
go test -race -count=1 -run '^$' ${PKGS} >/dev/null

hogs=()
stop_hogs() { ((${#hogs[@]})) && kill "${hogs[@]}" 2>/dev/null; wait 2>/dev/null || true; }
trap stop_hogs EXIT
cores="$(nproc)"
for _ in $(seq "${cores}"); do
	timeout "$((RUNS * 20))m" bash -c 'while :; do :; done' &
	hogs+=("$!")
done
echo "test-stress: ${RUNS} runs of ${PKGS} beside a busy loop on each of ${cores} cores"

passed=0
for i in $(seq "${RUNS}"); do
	start=$SECONDS
	if go test -race -count=1 ${PKGS} >"${out}/run-${i}.log" 2>&1; then
		passed=$((passed + 1))
		echo "run ${i}/${RUNS}: ok ($((SECONDS - start))s)"
		rm -f "${out}/run-${i}.log"
	else
		echo "run ${i}/${RUNS}: FAILED ($((SECONDS - start))s), output in ${out}/run-${i}.log"
		grep -E '^(--- FAIL|FAIL|panic:)|_test\.go:[0-9]+:' "${out}/run-${i}.log" | head -20 || true
	fi
done
echo "test-stress: ${passed} of ${RUNS} runs passed"
[[ "${passed}" -eq "${RUNS}" ]] && rmdir "${out}" 2>/dev/null || true
[[ "${passed}" -eq "${RUNS}" ]]
