package sanitize

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

func TestText(t *testing.T) {
	cases := []struct {
		name, in string
		max      int
		want     string
	}{
		{"short text is kept", "proxy refused CONNECT: 403 Forbidden", 64, "proxy refused CONNECT: 403 Forbidden"},
		{"control characters become one space", "bad\r\n\x00\x1b[31mred", 64, "bad [31mred"},
		{"invalid UTF-8 is replaced", "a\xffb", 64, "a\uFFFDb"},
		{"long text is cut with an ellipsis", strings.Repeat("x", 100), 10, "xxxxxxx…"},
		{"a cut never splits a rune", "ééééé", 6, "é…"},
		{"exactly max is not cut", "abcd", 4, "abcd"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Text(tc.in, tc.max)
			assert.Equal(t, tc.want, got)
			assert.LessOrEqual(t, len(got), tc.max)
			assert.True(t, utf8.ValidString(got))
		})
	}
}

// A 100 MiB reason costs its bound, not its size.
func TestTextOfAHugeReasonIsBounded(t *testing.T) {
	got := Text(strings.Repeat("A", 100<<20), MaxReason)
	assert.Len(t, got, MaxReason)
	assert.True(t, strings.HasSuffix(got, "…"))
}

func TestUserinfo(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"user and password", "fetching https://u:secret@lists.example/x: refused", "fetching https://lists.example/x: refused"},
		{"user only", `Get "http://token@10.0.0.1:8080/p?a=b": EOF`, `Get "http://10.0.0.1:8080/p?a=b": EOF`},
		{"Go's starred password", "https://u:***@h/x", "https://h/x"},
		{"two URLs", "a http://x:y@h1/ b https://z@h2", "a http://h1/ b https://h2"},
		{"an @ in the path is kept", "https://h/users/@me", "https://h/users/@me"},
		{"an e-mail is not a URL", "mail ops@example.com", "mail ops@example.com"},
		{"no URL", "nothing here", "nothing here"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { assert.Equal(t, c.want, Userinfo(c.in)) })
	}
}
