// Package sanitize bounds text that crosses a trust boundary on its way
// into a Kubernetes object: a probe's failure reason is written by
// whatever answered the probe (a proxy, a target), and it ends up in a
// Condition message, which the API server caps at 32 KiB and a human reads.
package sanitize

import (
	"regexp"
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

// userinfo is the user:pass@ of a URL in text: a scheme, then anything
// up to an @ before the host's first slash, space or quote.
var userinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s"'<>]*@`)

// Userinfo removes the user name and password of every URL in s: a
// source's URL may carry them, and it is quoted in conditions, Events,
// logs and reports that more people read than may use them.
func Userinfo(s string) string {
	if !strings.Contains(s, "@") {
		return s
	}
	return userinfo.ReplaceAllString(s, "${1}")
}
