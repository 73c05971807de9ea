//go:build go1.25

package heartbeat

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTruncate(t *testing.T) {
	long := strings.Repeat("é", 50_000) // 100,000 bytes, two per character
	for _, tc := range []struct {
		in   string
		max  int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{strings.Repeat("a", 100), 40, strings.Repeat("a", 20) + "... (80 bytes more)"},
	} {
		if got := truncate(tc.in, tc.max); got != tc.want {
			t.Errorf("truncate(%d bytes, %d) = %q, want %q", len(tc.in), tc.max, got, tc.want)
		}
	}
	got := truncate(long, MaxMessage)
	if len(got) > MaxMessage || !utf8.ValidString(got) || !strings.HasSuffix(got, "bytes more)") {
		t.Errorf("a 100 KB message cut to %d bytes (valid UTF-8 %v): ...%s", len(got), utf8.ValidString(got), got[len(got)-30:])
	}
}

func TestJoinBounded(t *testing.T) {
	if got := joinBounded("available: ", []string{"a", "b"}, ", ", "", 100); got != "available: a, b" {
		t.Errorf("got %q", got)
	}
	// Issue: about 150 Deployments with long names made a 36 KB message.
	var names []string
	for i := range 300 {
		names = append(names, fmt.Sprintf("%03d-%s", i, strings.Repeat("n", 249)))
	}
	got := joinBounded("waiting for ", names, ", ", " to become available", MaxMessage)
	if len(got) > MaxMessage {
		t.Fatalf("%d bytes, over %d", len(got), MaxMessage)
	}
	shown := strings.Count(got, "nnnn, ") // each shown name is followed by ", "
	if !strings.HasPrefix(got, "waiting for 000-") || !strings.HasSuffix(got, fmt.Sprintf(", and %d more to become available", 300-shown)) {
		t.Errorf("want the first names and a count of the rest, got ...%s", got[len(got)-60:])
	}
	if shown < 10 {
		t.Errorf("only %d names shown in %d bytes", shown, len(got))
	}
	// One item longer than the bound on its own.
	one := joinBounded("", []string{strings.Repeat("x", 100_000), "second"}, "; ", "", MaxMessage)
	if len(one) > MaxMessage || !strings.Contains(one, "bytes more)") || !strings.HasSuffix(one, "; and 1 more") {
		t.Errorf("a 100 KB first item: %d bytes, ends ...%s", len(one), one[len(one)-40:])
	}
}
