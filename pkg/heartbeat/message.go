package heartbeat

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxMessage bounds every condition message the reporter writes, in bytes.
// The API server refuses a whole status write, and with it the heartbeat,
// when one condition's message is over 32,768 bytes; messages are built from
// component lists and from what SDK users pass, so each is cut to this size,
// which a person can still read, well inside that limit for the few
// conditions an AddonInstance carries.
const MaxMessage = 4096

// MaxConditions bounds the conditions an SDK user sets (SetCondition): each
// is written with every heartbeat, so their number bounds the status write,
// which the API server refuses whole past its request size limit (3 MiB;
// etcd's 1.5 MiB for the object). At MaxMessage bytes each they stay under
// 200 KiB.
const MaxConditions = 32

// MaxComponents bounds the components an SDK user reports (SetHealth), so
// that a Reporter's memory does not grow with names made up per request; the
// messages list the first few anyway.
const MaxComponents = 1024

// maxReason is metav1.Condition's bound on a reason: a component's reason
// becomes Degraded's, and the API server refuses a longer one.
const maxReason = 1024

// quoteBounded quotes s, or its first 64 bytes and its length.
func quoteBounded(s string) string {
	const max = 64
	if len(s) <= max {
		return fmt.Sprintf("%q", s)
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:cut], len(s))
}

// truncate cuts s to at most max bytes, at a character boundary, ending with
// a marker that says how much was cut.
func truncate(s string, max int) string {
	if len(s) <= max {
		return s
	}
	marker := func(cut int) string { return fmt.Sprintf("... (%d bytes more)", cut) }
	keep := max - len(marker(len(s)))
	if keep < 0 {
		keep = 0
	}
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return s[:keep] + marker(len(s)-keep)
}

// joinBounded is prefix, the items joined by sep, and suffix, in at most max
// bytes: when the items do not all fit, as many of the first as do are kept
// and followed by ", and N more" (each item cut to fit on its own).
func joinBounded(prefix string, items []string, sep, suffix string, max int) string {
	full := prefix + strings.Join(items, sep) + suffix
	if len(full) <= max {
		return full
	}
	var b strings.Builder
	b.WriteString(prefix)
	for i, item := range items {
		more := fmt.Sprintf("%sand %d more", sep, len(items)-i)
		if i > 0 {
			item = sep + item
		}
		room := max - b.Len() - len(more) - len(suffix)
		if len(item) > room {
			if i == 0 && room > 0 {
				// Not even the first fits: show what of it does.
				b.WriteString(truncate(item, room))
				more = fmt.Sprintf("%sand %d more", sep, len(items)-1)
				if len(items) == 1 {
					more = ""
				}
			}
			b.WriteString(more)
			break
		}
		b.WriteString(item)
	}
	b.WriteString(suffix)
	return truncate(b.String(), max)
}
