package heartbeat

import (
	"strings"
	"testing"
	"time"

	addonsv1alpha1 "github.com/openshift/addon-operator/apis/addons/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestPeriod(t *testing.T) {
	tests := map[string]struct {
		ai   *addonsv1alpha1.AddonInstance
		want time.Duration
	}{
		"nil instance":   {nil, DefaultPeriod},
		"zero":           {&addonsv1alpha1.AddonInstance{}, DefaultPeriod},
		"set":            {withPeriod(30 * time.Second), 30 * time.Second},
		"below minimum":  {withPeriod(10 * time.Millisecond), MinPeriod},
		"negative":       {withPeriod(-time.Second), DefaultPeriod},
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

func TestTimingsReplaceAKilledLeaderWithinThreePeriods(t *testing.T) {
	tests := map[string]time.Duration{
		"1s": time.Second, "1.5s": 1500 * time.Millisecond, "2s": 2 * time.Second,
		"10s": 10 * time.Second, "45s": 45 * time.Second, "5m": 5 * time.Minute,
	}
	for name, p := range tests {
		t.Run(name, func(t *testing.T) {
			tm := Timings(p)
			// client-go's own constraints.
			if tm.LeaseDuration <= tm.RenewDeadline || float64(tm.RenewDeadline) <= 1.2*float64(tm.RetryPeriod) {
				t.Fatalf("invalid timings %s", tm)
			}
			if tm.LeaseDuration%time.Second != 0 {
				t.Errorf("lease duration %s is not whole seconds", tm.LeaseDuration)
			}
			// Worst case after SIGKILL: one period since the last heartbeat,
			// a retry period to see the last renewal, the lease duration,
			// a jittered retry period.
			gap := p + tm.RetryPeriod + tm.LeaseDuration + tm.RetryPeriod*12/10
			if gap >= 3*p {
				t.Errorf("worst-case gap %s >= 3 x period %s", gap, 3*p)
			}
		})
	}
}

func TestTimingsStale(t *testing.T) {
	tests := map[string]struct {
		old, new time.Duration
		want     bool
	}{
		"same":         {10 * time.Second, 10 * time.Second, false},
		"longer":       {10 * time.Second, time.Minute, false},
		"a bit less":   {10 * time.Second, 7 * time.Second, false},
		"much shorter": {10 * time.Second, 2 * time.Second, true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := timingsStale(tt.old, tt.new); got != tt.want {
				t.Errorf("timingsStale(%s, %s) = %v", tt.old, tt.new, got)
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
