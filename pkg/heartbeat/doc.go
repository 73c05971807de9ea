// Package heartbeat keeps an AddonInstance's status current: each period one
// status write carries lastHeartbeatTime and the conditions the addon owns
// (Degraded, Installed, ReadyToBeDeleted, and any the addon sets itself),
// preserving every condition it does not own. It never writes Healthy, which
// the addon-operator computes, and never changes the spec.
//
// A Reporter is a controller-runtime manager.Runnable. It runs in two modes:
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
// Leader election: the Lease lives in the AddonInstance's namespace, its
// holder is the pod name, and it is released when the Reporter stops, so a
// standby takes over within one retry period. Its timings follow the period
// (see Timings) so that a killed leader is replaced before the operator's
// 3 x period timeout; a standby picks them from the period it reads when it
// starts campaigning, and a leader that sees the period shrink below what
// its timings cover hands the Lease back and campaigns again with new ones.
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
// and a change of spec.heartbeatUpdatePeriod is followed within one period.
package heartbeat
