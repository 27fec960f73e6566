// Package proxyauth is the credentials a proxy asks for: an External
// proxy's from the Secret its Proxy names (spec.credentialsSecretRef), a
// Managed proxy's derived from a key and its UID. The controller gives
// them to the instance and the probers, the broker to the crawler that
// leases the proxy.
package proxyauth

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Secret keys.
const (
	KeyUsername = "username"
	KeyPassword = "password"
)

// Credentials are a user name and password for Basic proxy auth.
type Credentials struct{ Username, Password string }

// Empty: the proxy asks for none.
func (c Credentials) Empty() bool { return c.Username == "" && c.Password == "" }

// Authorize puts c in h as Basic Proxy-Authorization, unless c is empty.
func (c Credentials) Authorize(h http.Header) {
	if !c.Empty() {
		h.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(c.Username+":"+c.Password)))
	}
}

// FromSecret reads the username and password keys; the error names the
// Secret and what is wrong with it.
func FromSecret(s *corev1.Secret) (Credentials, error) {
	c := Credentials{Username: string(s.Data[KeyUsername]), Password: string(s.Data[KeyPassword])}
	switch {
	case c.Username == "" || c.Password == "":
		return Credentials{}, fmt.Errorf("Secret %s/%s must hold non-empty %q and %q keys", s.Namespace, s.Name, KeyUsername, KeyPassword)
	case strings.ContainsAny(c.Username, ":\r\n"):
		return Credentials{}, fmt.Errorf("Secret %s/%s: %q may not hold a colon or a line break (Basic auth joins it to the password with a colon)", s.Namespace, s.Name, KeyUsername)
	}
	return c, nil
}

// MinKeyBytes is the shortest key Derive may use.
const MinKeyBytes = 32

// Key derives Managed proxies' credentials: each gets its own, from the
// key and its Proxy's UID, so the controller (configuring the instance,
// probing it) and the brokers (handing them to a crawler) agree without
// storing one Secret per proxy. An instance keeps what it was made with:
// a new key replaces every Managed proxy's credentials, so rotate it by
// rolling the proxies (a ProxyPool template change).
type Key []byte

// LoadKey reads a key file (the chart's generated Secret), or gives no
// key for ""; the error names the file and what is wrong.
func LoadKey(file string) (Key, error) {
	if file == "" {
		return nil, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	k := bytes.TrimSpace(b)
	if len(k) < MinKeyBytes {
		return nil, fmt.Errorf("%s holds %d bytes; a proxy credentials key needs at least %d", file, len(k), MinKeyBytes)
	}
	return Key(k), nil
}

// Derive is the proxy's user name and password: hex, so no proxy or
// helper protocol needs to escape them.
func (k Key) Derive(uid string) Credentials {
	if len(k) == 0 {
		return Credentials{}
	}
	mac := func(what string) string {
		h := hmac.New(sha256.New, k)
		h.Write([]byte(what + "\x00" + uid))
		return hex.EncodeToString(h.Sum(nil))
	}
	return Credentials{Username: "ep-" + mac("username")[:16], Password: mac("password")[:32]}
}

// Placeholders a Managed proxy's cloud-init may hold; Expand puts the
// proxy's credentials in their place before the instance boots.
const (
	PlaceholderUsername = "${EGRESS_PROXY_USERNAME}"
	PlaceholderPassword = "${EGRESS_PROXY_PASSWORD}"
)

// Expand replaces the placeholders in userData with c.
func (c Credentials) Expand(userData []byte) []byte {
	if !bytes.Contains(userData, []byte("${EGRESS_PROXY_")) {
		return userData
	}
	return []byte(strings.NewReplacer(PlaceholderUsername, c.Username, PlaceholderPassword, c.Password).Replace(string(userData)))
}

// SquidHelper is a basic-auth helper for Squid admitting only c: Squid's
// helper protocol sends "user password" a line and reads OK or ERR. Squid
// passes both URL-escaped, which leaves derived (hex) credentials as they
// are. The kubernetes provider's pods and the tests' Squids run this same
// script.
func (c Credentials) SquidHelper() string {
	return "#!/bin/sh\n" +
		"# Squid's basic auth helper protocol: \"user password\" in, OK or ERR out.\n" +
		"while read -r u p; do\n" +
		"  if [ \"$u\" = " + shellQuote(c.Username) + " ] && [ \"$p\" = " + shellQuote(c.Password) + " ]; then echo OK; else echo ERR; fi\n" +
		"done\n"
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
