package proxysource

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/kube"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/vendors"
)

// Defaults of a URL source, as the CRD declares them.
const (
	defaultRefresh  = 5 * time.Minute
	defaultTimeout  = 10 * time.Second
	defaultMaxBytes = 4 << 20
)

// reader reads a source's entries: ConfigMaps and Secrets through the
// cache (which holds only the labelled ones), URLs over HTTP held to the
// egress policy.
type reader struct {
	cache      client.Reader
	egress     netpolicy.Egress
	deny       netpolicy.DenyList
	namespaces []string
}

// read reads src's entries; the error says why none could be read.
func (r *reader) read(ctx context.Context, src *v1.ProxySource) (parsed, error) {
	if err := kube.CheckSecretNamespace(r.namespaces, src.Namespace, src.Name); err != nil {
		return parsed{}, fmt.Errorf("ProxySource %s/%s: its ConfigMaps and Secrets are not read in namespace %s; add it to the chart's secretNamespaces (--secret-namespaces)", src.Namespace, src.Name, src.Namespace)
	}
	rs := rules{limit: DefaultMaxEntries, deny: r.deny}
	if m := src.Spec.MaxEntries; m != nil {
		rs.limit = int(*m)
	}
	switch s := src.Spec; {
	case s.List != nil:
		body, err := r.listBody(ctx, src.Namespace, s.List)
		if err != nil {
			return parsed{}, err
		}
		return parse(bytes.NewReader(body), formatOr(s.List.Format), rs)
	case s.URL != nil:
		return r.fetch(ctx, src.Namespace, s.URL, rs)
	case s.Vendor != nil:
		return r.expand(ctx, src, rs)
	}
	return parsed{}, fmt.Errorf("spec has none of list, url and vendor")
}

func formatOr(f v1.SourceFormat) v1.SourceFormat {
	if f == "" {
		return v1.FormatLines
	}
	return f
}

func keyOr(k, def string) string {
	if k == "" {
		return def
	}
	return k
}

func (r *reader) listBody(ctx context.Context, ns string, l *v1.SourceList) ([]byte, error) {
	if ref := l.ConfigMapRef; ref != nil {
		var cm corev1.ConfigMap
		if err := r.cache.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref.Name}, &cm); err != nil {
			return nil, fmt.Errorf("reading ConfigMap %s/%s (it must be labelled %s=true): %w", ns, ref.Name, v1.LabelProxySource, err)
		}
		key := keyOr(ref.Key, "proxies")
		if v, ok := cm.Data[key]; ok {
			return []byte(v), nil
		}
		if v, ok := cm.BinaryData[key]; ok {
			return v, nil
		}
		return nil, fmt.Errorf("ConfigMap %s/%s has no key %q", ns, ref.Name, key)
	}
	return r.secretKey(ctx, ns, l.SecretRef.Name, keyOr(l.SecretRef.Key, "proxies"))
}

func (r *reader) secret(ctx context.Context, ns, name string) (*corev1.Secret, error) {
	var s corev1.Secret
	if err := r.cache.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
		return nil, fmt.Errorf("reading Secret %s/%s (it must be labelled %s=true): %w", ns, name, v1.LabelProxyCredentials, err)
	}
	return &s, nil
}

func (r *reader) secretKey(ctx context.Context, ns, name, key string) ([]byte, error) {
	s, err := r.secret(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	v, ok := s.Data[key]
	if !ok {
		return nil, fmt.Errorf("Secret %s/%s has no key %q", ns, name, key)
	}
	return v, nil
}

// fetch GETs u's list, bounded in time and size, over a connection held
// to the egress policy, and parses it as it arrives.
func (r *reader) fetch(ctx context.Context, ns string, u *v1.SourceURL, rs rules) (parsed, error) {
	timeout, limit := defaultTimeout, int64(defaultMaxBytes)
	if u.Timeout != nil {
		timeout = u.Timeout.Duration
	}
	if u.MaxBytes != nil {
		limit = *u.MaxBytes
	}
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12}
	if ref := u.CASecretRef; ref != nil {
		pem, err := r.secretKey(ctx, ns, ref.Name, keyOr(ref.Key, "ca.crt"))
		if err != nil {
			return parsed{}, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return parsed{}, fmt.Errorf("Secret %s/%s key %s holds no PEM certificate", ns, ref.Name, keyOr(ref.Key, "ca.crt"))
		}
		tlsConf.RootCAs = pool
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.URL, nil)
	if err != nil {
		return parsed{}, fmt.Errorf("spec.url.url: %w", err)
	}
	if ref := u.AuthSecretRef; ref != nil {
		s, err := r.secret(ctx, ns, ref.Name)
		if err != nil {
			return parsed{}, err
		}
		switch {
		case len(s.Data["token"]) > 0:
			req.Header.Set("Authorization", "Bearer "+string(s.Data["token"]))
		case len(s.Data["username"]) > 0:
			req.SetBasicAuth(string(s.Data["username"]), string(s.Data["password"]))
		default:
			return parsed{}, fmt.Errorf("Secret %s/%s has neither a token nor a username", ns, ref.Name)
		}
	}
	dialer := &net.Dialer{Control: r.egress.Control}
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: dialer.DialContext, TLSClientConfig: tlsConf, Proxy: nil,
		DisableKeepAlives: true, ResponseHeaderTimeout: timeout,
	}, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		return parsed{}, fmt.Errorf("fetching %s: %w", u.URL, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return parsed{}, fmt.Errorf("fetching %s: it answered %s", u.URL, clip(resp.Status))
	}
	if resp.ContentLength > limit {
		return parsed{}, fmt.Errorf("fetching %s: its body of %d bytes is over spec.url.maxBytes (%d)", u.URL, resp.ContentLength, limit)
	}
	p, err := parse(&capped{r: resp.Body, left: limit}, formatOr(u.Format), rs)
	switch {
	case errors.Is(err, errOverMaxBytes):
		return parsed{}, fmt.Errorf("fetching %s: its body is over spec.url.maxBytes (%d)", u.URL, limit)
	case err != nil:
		return parsed{}, fmt.Errorf("fetching %s: reading the body: %w", u.URL, err)
	}
	return p, nil
}

var errOverMaxBytes = errors.New("over spec.url.maxBytes")

// capped reads r until left bytes have passed, then fails: a body over
// the cap is refused whole, not cut where a line happens to end.
type capped struct {
	r    io.Reader
	left int64
}

func (c *capped) Read(b []byte) (int, error) {
	if c.left < 0 {
		return 0, errOverMaxBytes
	}
	if int64(len(b)) > c.left+1 {
		b = b[:c.left+1]
	}
	n, err := c.r.Read(b)
	c.left -= int64(n)
	if c.left < 0 {
		return n, errOverMaxBytes
	}
	return n, err
}

// expand turns a vendor endpoint into one entry per session and country.
func (r *reader) expand(ctx context.Context, src *v1.ProxySource, rs rules) (parsed, error) {
	v := src.Spec.Vendor
	pass, err := r.secretKey(ctx, src.Namespace, v.PasswordSecretRef.Name, "password")
	if err != nil {
		return parsed{}, err
	}
	rs.limit = DefaultMaxEntries // the CRD bounds sessions × countries
	p := newParsed(rs)
	countries := v.Countries
	if len(countries) == 0 {
		countries = []string{""}
	}
	for _, cc := range countries {
		for i := range int(v.Sessions) {
			s := vendors.Session{Account: v.Account, Zone: v.Zone, Groups: v.Groups, Country: cc, Minutes: int(v.SessionMinutes),
				ID: sessionPrefix(src) + cc + strconv.Itoa(i)}
			user, err := vendors.Format(v.Preset, v.Template, s)
			if err != nil {
				return parsed{}, fmt.Errorf("spec.vendor: %w", err)
			}
			e := Entry{Host: v.Host, Port: v.Port, Username: user, Password: string(pass)}
			if cc != "" {
				e.Attributes = map[string]string{"country": cc}
			}
			p.add("session "+s.ID, -1, e)
		}
	}
	return p, nil
}

// sessionPrefix is the vendor's session prefix, or the source's name
// without what vendors refuse in a session.
func sessionPrefix(src *v1.ProxySource) string {
	if p := src.Spec.Vendor.SessionPrefix; p != "" {
		return p
	}
	out := make([]byte, 0, len(src.Name))
	for _, c := range []byte(src.Name) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			out = append(out, c)
		}
	}
	return string(out[:min(len(out), 24)])
}
