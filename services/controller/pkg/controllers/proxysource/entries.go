package proxysource

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
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

// parsed is what one read of a source gave: the valid entries, by
// identity, and why each bad one was skipped.
type parsed struct {
	entries  map[string]Entry
	rejected []string
	total    int
}

func (p *parsed) reject(format string, args ...any) {
	p.total++
	if len(p.rejected) < maxRejected {
		p.rejected = append(p.rejected, fmt.Sprintf(format, args...))
	}
}

func (p *parsed) add(where string, e Entry) {
	if err := validEntry(e); err != nil {
		p.reject("%s: %v", where, err)
		return
	}
	if _, dup := p.entries[e.Identity()]; dup {
		p.reject("%s: %s is listed twice", where, e.Identity())
		return
	}
	p.entries[e.Identity()] = e
}

// Rejected counts every skipped entry, named or not.
func (p *parsed) Rejected() int { return p.total }

var hostPattern = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9.:]*[A-Za-z0-9])?$`)

// validEntry holds an entry to what a Proxy's spec accepts, so a bad
// line is named here rather than failing a create.
func validEntry(e Entry) error {
	switch {
	case e.Host == "" || len(e.Host) > 253 || !hostPattern.MatchString(e.Host):
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

// parse reads body in format.
func parse(body []byte, format v1.SourceFormat) parsed {
	p := parsed{entries: map[string]Entry{}}
	if format == v1.FormatJSON {
		var list []Entry
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&list); err != nil {
			// One array: it is whole or it is garbage.
			p.reject("the body is not a JSON array of {host, port, username, password, attributes}: %v", err)
			return p
		}
		for i, e := range list {
			p.add(fmt.Sprintf("entry %d", i), e)
		}
		return p
	}
	for i, line := range strings.Split(string(body), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		e, err := parseLine(line)
		if err != nil {
			p.reject("line %d: %v", i+1, err)
			continue
		}
		p.add(fmt.Sprintf("line %d", i+1), e)
	}
	return p
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
	} else if parts := strings.SplitN(line, ":", 3); len(parts) == 3 {
		hostport, creds = parts[0]+":"+parts[1], parts[2]
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
