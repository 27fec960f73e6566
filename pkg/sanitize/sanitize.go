// Package sanitize bounds text that crosses a trust boundary on its way
// into a Kubernetes object: a probe's failure reason is written by
// whatever answered the probe (a proxy, a target), and it ends up in a
// Condition message, which the API server caps at 32 KiB and a human reads.
package sanitize

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxReason is how long a probe's failure reason may be, in bytes. A
// reason names a phase and an answer; anything longer is an answer that
// was not meant for a human.
const MaxReason = 512

// Text returns s as valid UTF-8 without control characters (each run of
// them becomes one space), cut to at most max bytes at a rune boundary
// with "…" marking the cut.
func Text(s string, max int) string {
	var b strings.Builder
	b.Grow(min(len(s), max))
	space := false
	for i, r := range s {
		if b.Len() > max {
			return cut(b.String(), max)
		}
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				r = '\uFFFD'
			}
		}
		if unicode.IsControl(r) || (unicode.IsSpace(r) && r != ' ') {
			if !space {
				b.WriteByte(' ')
			}
			space = true
			continue
		}
		space = r == ' '
		b.WriteRune(r)
	}
	return cut(b.String(), max)
}

// cut trims s to max bytes, ending in "…" when anything was cut.
func cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	const ellipsis = "…"
	end := max - len(ellipsis)
	for end > 0 && !utf8.RuneStart(s[end]) {
		end--
	}
	return s[:end] + ellipsis
}
