// Package proxyauth reads a proxy's credentials from the Secret its
// Proxy names (spec.credentialsSecretRef): the controller gives them to
// the probers, the broker to the crawler that leases the proxy.
package proxyauth

import (
	"encoding/base64"
	"fmt"
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

// Header is the Proxy-Authorization value.
func (c Credentials) Header() string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(c.Username+":"+c.Password))
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
