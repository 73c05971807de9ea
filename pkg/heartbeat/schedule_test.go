//go:build go1.25

package heartbeat

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	addonsv1alpha1 "github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/internal/addonsv1alpha1"

	"github.com/addon-heartbeat/addon-heartbeat/pkg/heartbeat/election"
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
			if got := instancePeriod(tt.ai); got != tt.want {
				t.Errorf("instancePeriod = %s, want %s", got, tt.want)
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
			tm := election.Timings(p)
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

func TestWriteTimeoutInsidePeriod(t *testing.T) {
	for _, p := range []time.Duration{time.Second, 10 * time.Second, time.Hour} {
		if w, h := WriteTimeout(p), healthTimeout(p); w+h >= p || w > maxWriteTimeout || h > maxHealthTimeout {
			t.Errorf("period %s: write timeout %s + health timeout %s do not fit", p, w, h)
		}
	}
}
