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
// Timing: heartbeats are scheduled from a fixed origin (origin + k x period),
// so write latency never shifts the schedule; one goroutine does every write,
// so two writes are never in flight; each write is bounded by WriteTimeout and
// retries conflicts a bounded number of times against fresh state; failures
// back off (never faster than 100ms, never slower than one period) and never
// stop the loop. The first heartbeat goes out as soon as the Reporter leads,
// and a change of spec.heartbeatUpdatePeriod is followed within one period.
package heartbeat
