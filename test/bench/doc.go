// Package bench measures addon-heartbeat end to end with its real binaries as
// processes on a local control plane (internal/localcluster): admission
// throughput and latency of the webhook over TLS, the reporter's footprint,
// the requests it makes to the API server, 200 AddonInstances on one API
// server, and leader failover. Every figure is a Go benchmark metric
// (b.ReportMetric); BENCHMARKS.md at the repository root records them.
//
// The benchmarks run with `make bench`. Without -bench nothing is started,
// so `go test ./...` stays cheap. Durations and sizes are environment
// variables (see the BENCH_* names in each benchmark), with defaults that
// keep the whole run under about 15 minutes on two cores.
package bench
