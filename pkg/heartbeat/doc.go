// Package heartbeat keeps an AddonInstance's status current: each period one
// status write carries lastHeartbeatTime and the conditions the addon owns
// (Degraded, Installed, ReadyToBeDeleted, and any the addon sets itself),
// preserving every condition it does not own. It never writes Healthy, which
// the addon-operator computes, and never changes the spec.
//
// A Reporter is a controller-runtime manager.Runnable (by its methods: the
// package itself uses client-go only, to keep the sidecar small). It runs in
// two modes:
//
//   - zero-code: cmd/reporter, the sidecar the webhook injects, runs a
//     Reporter with DeploymentHealth (and optionally HealthURL) so that the
//     availability of the addon's injected Deployments drives Degraded and
//     Installed;
//   - SDK: an addon adds a Reporter to its own manager and reports its own
//     health with SetHealth and SetCondition.
//
// One writer per AddonInstance: every Reporter campaigns for a Lease named
// after its AddonInstance (LeaseName), so only one replica of one addon
// writes, whichever Deployment it belongs to. The leader watches only its
// AddonInstance (a field selector on its name) and, in zero-code mode, the
// Deployments of its namespace reduced to the fields health needs. Standby
// replicas hold no cache at all.
//
// Leader election: the Lease lives in the AddonInstance's namespace and its
// holder is the pod name. Each period the leader writes its heartbeat and
// then renews the Lease, so it writes the Lease once per period and every
// renewal follows a heartbeat that went through; it announces the period on
// it (PeriodAnnotation). Standbys watch it (one event per renewal, no reads)
// and take it over once it has not changed for its lease duration, judged by
// their own clock, after reading the AddonInstance's period again. The
// timings (see Timings) keep the gap a killed leader leaves at 1.75 x
// period, under 2, inside the operator's 3 x period timeout, and follow a
// period change with the next renewal. A missing Lease is made again with no
// holder and taken only when the term of the holder of the one that went has
// ended, or, when that holder's record was not seen, a lease duration after
// the new one was (except on a first install). A leader that cannot write
// within its hold, or finds another holder, stops writing at once. A
// Reporter that stops releases the Lease, and a standby takes it as the
// watch brings the release.
// NeedLeaderElection is false: the election is per AddonInstance and spans
// every Deployment that reports into it, which a manager's own election does
// not. With Options.DisableLeaderElection the manager's election gates the
// Reporter instead.
//
// Conditions: Degraded, Installed and ReadyToBeDeleted are the Reporter's
// (see Compute); ReadyToBeDeleted is written only while markedForDeletion and
// removed otherwise. Healthy, and every condition of another type, is
// preserved as read: each write is a read-modify-write Status().Update
// against the resourceVersion, never a merge patch or server-side apply,
// because status.conditions is not a map-list in the upstream CRD.
//
// Timing: heartbeats are scheduled from a fixed origin (origin + k x period),
// so write latency never shifts the schedule; one goroutine does every write,
// so two writes are never in flight; each write is bounded by WriteTimeout and
// retries conflicts a bounded number of times against fresh state; failures
// back off (never faster than 100ms, never slower than one period) and never
// stop the loop. The first heartbeat goes out as soon as the Reporter leads,
// and a change of spec.heartbeatUpdatePeriod is followed within one period: a
// shorter one from the last heartbeat, a longer one with a heartbeat at once,
// whose renewal holds the Lease on the new period's terms (the hold taken on
// the old terms would end before the next tick).
package heartbeat
