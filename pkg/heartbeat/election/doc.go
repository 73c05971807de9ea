// Package election elects the one writer of an AddonInstance's heartbeat:
// one process among every replica of every Deployment that reports into it,
// on a coordination.k8s.io Lease in the AddonInstance's namespace
// (LeaseName), in the style of client-go's leaderelection but paced by the
// writer and hardened for what a fleet meets.
//
// Why not client-go's leaderelection: it renews on its own ticker, a Lease
// write every retry period (2 s by default) per addon, against one write per
// heartbeat period here (the writer renews right after each heartbeat that
// went through, see Elector.Renew). With client-go tuned to the period (a
// retry period of P/4) the reporter made four Lease writes per heartbeat,
// 42% of the leader's CPU in a profile; paced by the heartbeat it makes 2.0
// requests per period in all, with 1 replica or 3 (BENCHMARKS.md, sections
// 2 and 3). A ticker of its own also lets a renewal announce a heartbeat that
// was never written: a leader stuck between the two leaves a gap of a period
// plus a lease duration, where renewing after the write bounds it by the
// lease duration (1.57 periods at most over 20 SIGKILLs, section 5). And it
// has no notion of the writer's period, so its timings cannot follow a
// change of heartbeatUpdatePeriod. Standbys here watch the Lease instead of
// polling it (no request while the leader renews), and a take is judged
// against the period as read after the record it judges.
//
// The rules it keeps, each checked by its tests and by the heartbeat
// package's simulation over thousands of random schedules of faults:
//
//   - Expiry is judged by the local time at which this process last saw the
//     holder's record change, never by comparing clocks across machines. A
//     record is honoured for at most the lease duration of the period as
//     read (a forged Lease cannot stall an addon).
//   - A missing Lease is made again with no holder, never taken as it is (a
//     create cannot be conditioned on what came before); a vacant Lease is
//     taken only after the term of the holder of the one that went has ended
//     (a fence), or, when that record was not seen in an unbroken view, a
//     lease duration after the vacant one was.
//   - Every write of a hold is an update against the version seen: a stale
//     view costs a conflict, never a second holder. A take that conflicts
//     waits for the watch to bring what was missed, in order.
//   - A process that ends a term without releasing it (it failed to do its
//     work within the hold) waits its own record out, and a retry period
//     more, so that a standby that can work takes over first (Yield).
//   - Two processes with one Identity tell each other apart by a token of
//     each process on the Lease, and never both hold it.
package election
