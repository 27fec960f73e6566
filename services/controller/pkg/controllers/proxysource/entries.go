package proxysource

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
)

// Entry is one proxy a source names. Host, port and user name together
// are its identity: two sessions on one endpoint are two proxies.
type Entry struct {
	Host       string            `json:"host"`
	Port       int32             `json:"port"`
	Username   string            `json:"username,omitempty"`
	Password   string            `json:"password,omitempty"`
	Attributes map[string]string `json:"attributes,omitempty"`
}

// Identity is host:port, and the user name when there is one: what the
// member is annotated with.
func (e Entry) Identity() string {
	id := net.JoinHostPort(e.Host, strconv.Itoa(int(e.Port)))
	if e.Username != "" {
		id += " " + e.Username
	}
	return id
}

// memberName is the member's name: the source's and a hash of the
// identity, so a retried create always names the same Proxy and a
// restarted controller finds what it made.
func memberName(source string, e Entry) string {
	sum := sha256.Sum256([]byte(e.Identity()))
	return source + "-" + hex.EncodeToString(sum[:])[:10]
}

// maxRejected bounds the rejected entries a status names.
const maxRejected = 10

// DefaultMaxEntries is spec.maxEntries' default, and a vendor source's
// bound (sessions × countries).
const DefaultMaxEntries = 10000

// maxLine bounds one line of a list: the longest valid one (a 253-byte
// host, a port, a 256-byte user name and password) is under a kilobyte.
const maxLine = 4 << 10

// parsed is what one read of a source gave: the valid entries, by
// identity, up to the source's cap; why each bad one was skipped; how
// many valid ones the cap left out.
type parsed struct {
	entries  map[string]Entry
	rejected []string
	total    int
	rules
	// over counts the entries past the limit, unread.
	over int
}

// rules are what an entry is held to beyond its syntax.
type rules struct {
	// limit is the most entries kept (spec.maxEntries).
	limit int
	// deny is the proxy-address policy: no member may be made at an
	// address in it, whoever wrote the list.
	deny netpolicy.DenyList
}

func newParsed(r rules) parsed {
	if r.limit <= 0 {
		r.limit = DefaultMaxEntries
	}
	return parsed{entries: map[string]Entry{}, rules: r}
}

func (p *parsed) reject(format string, args ...any) {
	p.total++
	if len(p.rejected) < maxRejected {
		p.rejected = append(p.rejected, fmt.Sprintf(format, args...))
	}
}

// add keeps e, or rejects it naming where it was: kind and n ("line",
// 7), formatted only for a rejection, since most lines are fine; n < 0
// names it by kind alone.
func (p *parsed) add(kind string, n int, e Entry) {
	where := func() string {
		if n < 0 {
			return kind
		}
		return kind + " " + strconv.Itoa(n)
	}
	if err := validEntry(e); err != nil {
		p.reject("%s: %v", where(), err)
		return
	}
	if prefix, denied := p.deny.DeniesHost(e.Host); denied {
		p.reject("%s: %s is in the proxy-address deny list (%s)", where(), e.Host, prefix)
		return
	}
	id := e.Identity()
	if _, dup := p.entries[id]; dup {
		p.reject("%s: %s is listed twice", where(), id)
		return
	}
	p.entries[id] = e
}

// full says whether the cap is reached: what comes after is counted as
// over, not read, so a list's length past the cap costs a byte scan.
func (p *parsed) full() bool { return len(p.entries) >= p.limit }

// Rejected counts every skipped entry, named or not.
func (p *parsed) Rejected() int { return p.total }

// validHost is a Proxy's spec.address pattern,
// ^[A-Za-z0-9]([-A-Za-z0-9.:]*[A-Za-z0-9])?$, checked byte by byte: it
// runs once per line of lists of millions.
func validHost(h string) bool {
	alnum := func(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	if h == "" || !alnum(h[0]) || !alnum(h[len(h)-1]) {
		return false
	}
	for i := 1; i < len(h)-1; i++ {
		if c := h[i]; !alnum(c) && c != '-' && c != '.' && c != ':' {
			return false
		}
	}
	return true
}

// validEntry holds an entry to what a Proxy's spec accepts, so a bad
// line is named here rather than failing a create.
func validEntry(e Entry) error {
	switch {
	case len(e.Host) > 253 || !validHost(e.Host):
		return fmt.Errorf("host %q is not a host name or IP address", clip(e.Host))
	case e.Port < 1 || e.Port > 65535:
		return fmt.Errorf("port %d is not 1-65535", e.Port)
	case (e.Username == "") != (e.Password == ""):
		return fmt.Errorf("a user name needs a password, and a password a user name")
	case strings.ContainsAny(e.Username, ":\r\n") || len(e.Username) > 256 || len(e.Password) > 256:
		return fmt.Errorf("the user name may not hold ':' and neither it nor the password may pass 256 bytes")
	}
	for k, v := range e.Attributes {
		if errs := validation.IsQualifiedName(k); len(k) > 63 || len(errs) > 0 || strings.Contains(k, "/") {
			return fmt.Errorf("attribute name %q is not 1-63 letters, digits, '-', '_' or '.'", clip(k))
		}
		if len(v) < 1 || len(v) > 63 {
			return fmt.Errorf("attribute %s: values must be 1-63 characters", k)
		}
	}
	return nil
}

// parse reads body in format as it streams, keeping at most r.limit
// entries: what it holds is bounded by the cap and a line, never by the
// body. The error is body's own (a failed or oversized read); what is
// wrong with the list is in the result's rejections.
func parse(body io.Reader, format v1.SourceFormat, r rules) (parsed, error) {
	p := newParsed(r)
	if format == v1.FormatJSON {
		return p, parseJSON(&p, body)
	}
	br := bufio.NewReaderSize(body, maxLine)
	for n := 1; ; n++ {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			p.reject("line %d: longer than %d bytes", n, maxLine)
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			line = nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return p, err
		}
		switch t := bytes.TrimSpace(line); {
		case len(t) == 0 || t[0] == '#':
		case p.full():
			p.over++
		default:
			if e, perr := parseLine(string(t)); perr != nil {
				p.reject("line %d: %v", n, perr)
			} else {
				p.add("line", n, e)
			}
		}
		if err != nil {
			return p, nil
		}
	}
}

// parseJSON reads one array of entries an element at a time. The array
// is whole or garbage: a syntax error anywhere leaves no entry.
func parseJSON(p *parsed, body io.Reader) error {
	cr := &bodyErr{r: body}
	dec := json.NewDecoder(cr)
	dec.DisallowUnknownFields()
	garbage := func(err error) error {
		if cr.err != nil {
			return cr.err
		}
		p.entries, p.over, p.rejected, p.total = map[string]Entry{}, 0, nil, 0
		p.reject("the body is not a JSON array of {host, port, username, password, attributes}: %v", err)
		return nil
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		if err == nil {
			err = fmt.Errorf("it starts with %v, not [", tok)
		}
		return garbage(err)
	}
	for i := 0; dec.More(); i++ {
		var e Entry
		if err := dec.Decode(&e); err != nil {
			return garbage(err)
		}
		if p.full() {
			p.over++
			continue
		}
		p.add("entry", i, e)
	}
	if _, err := dec.Token(); err != nil {
		return garbage(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return garbage(fmt.Errorf("something follows the array"))
	}
	return nil
}

// bodyErr keeps the body's own error apart from the decoder's.
type bodyErr struct {
	r   io.Reader
	err error
}

func (c *bodyErr) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	if err != nil && !errors.Is(err, io.EOF) {
		c.err = err
	}
	return n, err
}

// parseLine reads host:port[:user:pass]; an IPv6 host goes in brackets.
func parseLine(line string) (Entry, error) {
	var e Entry
	hostport, creds := line, ""
	if strings.HasPrefix(line, "[") {
		end := strings.Index(line, "]:")
		if end < 0 {
			return e, fmt.Errorf("%q is not [ipv6]:port[:user:pass]", clip(line))
		}
		rest := line[end+2:]
		port, c, _ := strings.Cut(rest, ":")
		hostport, creds = line[:end+2]+port, c
	} else if host, rest, ok := strings.Cut(line, ":"); ok {
		if port, c, ok := strings.Cut(rest, ":"); ok {
			hostport, creds = line[:len(host)+1+len(port)], c
		}
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return e, fmt.Errorf("%q is not host:port[:user:pass]", clip(line))
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return e, fmt.Errorf("port %q is not a number", clip(port))
	}
	e.Host, e.Port = host, int32(n)
	if creds != "" {
		user, pass, ok := strings.Cut(creds, ":")
		if !ok {
			return e, fmt.Errorf("credentials must be user:pass")
		}
		e.Username, e.Password = user, pass
	}
	return e, nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
