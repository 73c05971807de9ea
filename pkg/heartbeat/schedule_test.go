package heartbeat

import (
	"strings"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

func TestPeriod(t *testing.T) {
	tests := map[string]struct {
		ai   *addonsv1alpha1.AddonInstance
		want time.Duration
	}{
		"nil instance": {nil, DefaultPeriod},
		// An explicit 0s is stored (the CRD default is for an absent
		// field): heartbeat at the floor, as for any period below it.
		"zero":           {&addonsv1alpha1.AddonInstance{}, MinPeriod},
		"set":            {withPeriod(30 * time.Second), 30 * time.Second},
		"below minimum":  {withPeriod(10 * time.Millisecond), MinPeriod},
		"negative":       {withPeriod(-time.Second), MinPeriod},
		"minimum itself": {withPeriod(time.Second), time.Second},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := Period(tt.ai); got != tt.want {
				t.Errorf("Period = %s, want %s", got, tt.want)
			}
		})
	}
}

func withPeriod(p time.Duration) *addonsv1alpha1.AddonInstance {
	return &addonsv1alpha1.AddonInstance{Spec: addonsv1alpha1.AddonInstanceSpec{HeartbeatUpdatePeriod: metav1.Duration{Duration: p}}}
}

func TestNextTickHasNoDrift(t *testing.T) {
	origin := time.Unix(1000, 0)
	p := 10 * time.Second
	tests := map[string]struct {
		now  time.Time
		want time.Time
	}{
		"right at origin":          {origin, origin.Add(p)},
		"write took 300ms":         {origin.Add(300 * time.Millisecond), origin.Add(p)},
		"third tick, late write":   {origin.Add(2*p + 900*time.Millisecond), origin.Add(3 * p)},
		"exactly on a tick":        {origin.Add(2 * p), origin.Add(3 * p)},
		"missed ticks are skipped": {origin.Add(5*p + time.Second), origin.Add(6 * p)},
		"clock before origin":      {origin.Add(-time.Second), origin.Add(p)},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := nextTick(origin, p, tt.now); !got.Equal(tt.want) {
				t.Errorf("nextTick = %s, want %s", got.Sub(origin), tt.want.Sub(origin))
			}
		})
	}
}

func TestLastTick(t *testing.T) {
	origin := time.Unix(1000, 0)
	p := 2 * time.Second
	tests := map[string]struct {
		now  time.Time
		want time.Time
	}{
		"at origin":    {origin, origin},
		"between":      {origin.Add(3 * time.Second), origin.Add(2 * time.Second)},
		"on a tick":    {origin.Add(4 * time.Second), origin.Add(4 * time.Second)},
		"before start": {origin.Add(-time.Second), origin},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := lastTick(origin, p, tt.now); !got.Equal(tt.want) {
				t.Errorf("lastTick = %s, want %s", got.Sub(origin), tt.want.Sub(origin))
			}
		})
	}
}

func TestNextBackoff(t *testing.T) {
	tests := map[string]struct {
		prev, period, want time.Duration
	}{
		"first, long period":  {0, 10 * time.Second, time.Second},
		"first, short period": {0, time.Second, 100 * time.Millisecond},
		"doubles":             {time.Second, 10 * time.Second, 2 * time.Second},
		"capped at period":    {8 * time.Second, 10 * time.Second, 10 * time.Second},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := nextBackoff(tt.prev, tt.period); got != tt.want {
				t.Errorf("nextBackoff = %s, want %s", got, tt.want)
			}
		})
	}
}

// The timings' own constraints; what they buy (a killed leader replaced
// within 2 periods wherever it dies, a late write landing in order) is shown
// by TestAKilledLeaderIsReplacedWithinTwoPeriodsWhereverItDies on the real
// API server and by the simulation (TestSim).
func TestTimingsKeepTheirOrder(t *testing.T) {
	tests := map[string]time.Duration{
		"1s": time.Second, "1.5s": 1500 * time.Millisecond, "2s": 2 * time.Second, "3s": 3 * time.Second,
		"10s": 10 * time.Second, "45s": 45 * time.Second, "5m": 5 * time.Minute,
	}
	for name, p := range tests {
		t.Run(name, func(t *testing.T) {
			tm := Timings(p)
			if got := time.Duration(leaseSeconds(tm.LeaseDuration)) * time.Second; got < tm.LeaseDuration || got-tm.LeaseDuration >= time.Second {
				t.Errorf("leaseDurationSeconds %s for a lease of %s: want it rounded up to whole seconds", got, tm.LeaseDuration)
			}
			// The next heartbeat goes out a period after the renewal, on
			// its hold, with room for a retry after a failed write...
			if tm.RenewDeadline < p+nextBackoff(0, p)+WriteTimeout(p)/2 {
				t.Errorf("renew deadline %s leaves no room after a period %s for a retry", tm.RenewDeadline, p)
			}
			// ...and a standby waits past the end of any hold.
			if tm.RenewDeadline >= tm.LeaseDuration {
				t.Errorf("renew deadline %s, lease %s: a standby could take over inside a hold", tm.RenewDeadline, tm.LeaseDuration)
			}
			// A standby whose try failed tries again at least twice per hold.
			if tm.RetryPeriod > tm.LeaseDuration/2 || tm.RetryPeriod < MinPeriod/2 {
				t.Errorf("retry period %s for lease %s", tm.RetryPeriod, tm.LeaseDuration)
			}
		})
	}
}

func TestCheckIntervalNeverExceedsTheRetryPeriod(t *testing.T) {
	for _, p := range []time.Duration{time.Second, 2 * time.Second, 10 * time.Second} {
		r := Timings(p).RetryPeriod
		lo, hi := r, time.Duration(0)
		for range 1000 {
			d := checkInterval(p)
			lo, hi = min(lo, d), max(hi, d)
		}
		if hi > r || lo < r*9/10 {
			t.Errorf("period %s: check intervals in [%s, %s], want within [%s, %s]", p, lo, hi, r*9/10, r)
		}
		if lo == hi {
			t.Errorf("period %s: check interval %s never varies; standbys started together would stay in step", p, lo)
		}
	}
}

func TestWriteTimeoutInsidePeriod(t *testing.T) {
	for _, p := range []time.Duration{time.Second, 10 * time.Second, time.Hour} {
		if w, h := WriteTimeout(p), healthTimeout(p); w+h >= p || w > maxWriteTimeout || h > maxHealthTimeout {
			t.Errorf("period %s: write timeout %s + health timeout %s do not fit", p, w, h)
		}
	}
}

func TestLeaseName(t *testing.T) {
	long := strings.Repeat("a", 60) + ".b" + strings.Repeat("c", 40)
	tests := map[string]struct {
		instance string
		want     string
	}{
		"default":        {"addon-instance", "addon-heartbeat-addon-instance"},
		"long":           {long, ""},
		"dot at the cut": {strings.Repeat("a", 46) + "." + strings.Repeat("b", 30), ""},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got := LeaseName(tt.instance)
			if tt.want != "" && got != tt.want {
				t.Errorf("LeaseName = %q, want %q", got, tt.want)
			}
			if len(got) > 63 {
				t.Errorf("LeaseName %q is %d characters", got, len(got))
			}
			if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
				t.Errorf("LeaseName %q: %v", got, errs)
			}
			if got == LeaseName(tt.instance+"x") {
				t.Errorf("different instances share Lease %q", got)
			}
		})
	}
}

func TestAStandbyWaitsForTheEndOfTheHoldersTerm(t *testing.T) {
	const period = 2 * time.Second // lease 3.5s, retries after 0.9-1s
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	lease := func(holder string) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{PeriodAnnotation: period.String()}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](4)},
		}
	}
	tests := map[string]struct {
		holder   string
		observed time.Duration // how long ago the record last changed
		lo, hi   time.Duration
	}{
		"renewed just now: the whole term":          {holder: "other", observed: 0, lo: 3501 * time.Millisecond, hi: 3501 * time.Millisecond},
		"renewed a while ago: the rest of the term": {holder: "other", observed: 3300 * time.Millisecond, lo: 201 * time.Millisecond, hi: 201 * time.Millisecond},
		"term already over: a retry":                {holder: "other", observed: 5 * time.Second, lo: 900 * time.Millisecond, hi: time.Second},
		"released (no holder): a retry":             {holder: "", observed: 2800 * time.Millisecond, lo: 900 * time.Millisecond, hi: time.Second},
		"this process's own: a retry":               {holder: "me", observed: 2800 * time.Millisecond, lo: 900 * time.Millisecond, hi: time.Second},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			l := &leaseLock{identity: "me", clock: clocktesting.NewFakePassiveClock(now),
				lease: lease(tt.holder), observedAt: now.Add(-tt.observed)}
			if got := l.wait(time.Minute); got < tt.lo || got > tt.hi {
				t.Errorf("wait = %s, want in [%s, %s]", got, tt.lo, tt.hi)
			}
		})
	}
}
