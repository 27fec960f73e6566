// Package vendors reads and writes the proxy user-name grammars of the
// back-connect vendors a ProxySource can expand: the controller writes a
// user name per session, the gateway reads a crawler's existing one as
// aliases of its own options, and the suites' vendor stand-in refuses
// what a vendor would. One grammar per vendor, in one table, so the three
// cannot drift apart.
package vendors

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

// Session is the parts of one user name.
type Session struct {
	// Account is the customer or user id (Bright Data, Oxylabs, Decodo).
	Account string
	// Zone is Bright Data's zone; Groups Apify's proxy groups.
	Zone, Groups string
	// ID is the session: one exit for as long as the vendor keeps it.
	ID string
	// Country is ISO 3166 alpha-2, lower case; "" for any.
	Country string
	// Minutes asks the vendor to keep the exit this long (0: its default).
	Minutes int
}

// grammar is one vendor's user name: a prefix, then key/value options
// joined by sep, each key once.
type grammar struct {
	preset v1.VendorPreset
	// lead is the first key (its value is the account or groups).
	lead string
	sep  string
	// keys are the option keys in the order they are written; required
	// those that must be present.
	keys     []string
	required []string
	// upperCountry: the vendor writes countries in upper case.
	upperCountry bool
	// fields map keys to the Session's parts.
	fields map[string]string
	// prefix is written before the lead key ("brd-").
	prefix string
}

const (
	fAccount = "account"
	fZone    = "zone"
	fGroups  = "groups"
	fSession = "session"
	fCountry = "country"
	fMinutes = "minutes"
)

var grammars = []grammar{
	{preset: v1.PresetBrightData, prefix: "brd-", lead: "customer", sep: "-",
		keys: []string{"customer", "zone", "country", "session"}, required: []string{"customer", "zone"},
		fields: map[string]string{"customer": fAccount, "zone": fZone, "country": fCountry, "session": fSession}},
	{preset: v1.PresetOxylabs, lead: "customer", sep: "-", upperCountry: true,
		keys: []string{"customer", "cc", "sessid", "sesstime"}, required: []string{"customer"},
		fields: map[string]string{"customer": fAccount, "cc": fCountry, "sessid": fSession, "sesstime": fMinutes}},
	{preset: v1.PresetDecodo, lead: "user", sep: "-",
		keys: []string{"user", "country", "session", "sessionduration"}, required: []string{"user"},
		fields: map[string]string{"user": fAccount, "country": fCountry, "session": fSession, "sessionduration": fMinutes}},
	{preset: v1.PresetApify, lead: "groups", sep: ",", upperCountry: true,
		keys: []string{"groups", "session", "country"}, required: []string{"groups"},
		fields: map[string]string{"groups": fGroups, "session": fSession, "country": fCountry}},
}

func grammarOf(p v1.VendorPreset) (grammar, bool) {
	i := slices.IndexFunc(grammars, func(g grammar) bool { return g.preset == p })
	if i < 0 {
		return grammar{}, false
	}
	return grammars[i], true
}

// Format writes s's user name in preset's grammar; template is a Custom
// preset's ({session}, {country}, {COUNTRY}).
func Format(preset v1.VendorPreset, template string, s Session) (string, error) {
	if preset == v1.PresetCustom {
		return strings.NewReplacer("{session}", s.ID, "{country}", s.Country, "{COUNTRY}", strings.ToUpper(s.Country)).Replace(template), nil
	}
	g, ok := grammarOf(preset)
	if !ok {
		return "", fmt.Errorf("vendor preset %q is not one of BrightData, Oxylabs, Decodo, Apify, Custom", preset)
	}
	parts := []string{}
	for _, k := range g.keys {
		v := g.get(s, k)
		if v == "" {
			continue
		}
		parts = append(parts, k+"-"+v)
	}
	return g.prefix + strings.Join(parts, g.sep), nil
}

func (g grammar) get(s Session, key string) string {
	switch g.fields[key] {
	case fAccount:
		return s.Account
	case fZone:
		return s.Zone
	case fGroups:
		return s.Groups
	case fSession:
		return s.ID
	case fCountry:
		if g.upperCountry {
			return strings.ToUpper(s.Country)
		}
		return s.Country
	case fMinutes:
		if s.Minutes > 0 {
			return strconv.Itoa(s.Minutes)
		}
	}
	return ""
}

// Detect names the preset whose grammar user is written in, or "" when
// it is none of the four.
func Detect(user string) v1.VendorPreset {
	for _, g := range grammars {
		if strings.HasPrefix(user, g.prefix+g.lead+"-") {
			return g.preset
		}
	}
	return ""
}

// Parse reads user in preset's grammar. The error names what is wrong:
// an option the vendor does not know, one given twice, one missing, a
// bad value. Vendors answer such a name with 407.
func Parse(preset v1.VendorPreset, user string) (Session, error) {
	var s Session
	g, ok := grammarOf(preset)
	if !ok {
		return s, fmt.Errorf("vendor preset %q has no grammar to read", preset)
	}
	rest, _ := strings.CutPrefix(user, g.prefix)
	if !strings.HasPrefix(user, g.prefix+g.lead+"-") {
		return s, fmt.Errorf("%s user name must start with %q", preset, g.prefix+g.lead+"-")
	}
	seen := map[string]bool{}
	tokens := strings.Split(rest, g.sep)
	for i := 0; i < len(tokens); i++ {
		key, value := tokens[i], ""
		if g.sep == "-" {
			// key-value-key-value: the value is the next token.
			if i+1 < len(tokens) {
				value = tokens[i+1]
			}
			i++
		} else {
			key, value, _ = strings.Cut(tokens[i], "-")
		}
		switch {
		case key == "":
			return s, fmt.Errorf("%s user name has an empty option", preset)
		case !slices.Contains(g.keys, key):
			return s, fmt.Errorf("%s user name option %q is unknown (options: %s)", preset, clip(key), strings.Join(g.keys, ", "))
		case seen[key]:
			return s, fmt.Errorf("%s user name option %q is given twice", preset, key)
		case value == "" || !validValue(value):
			return s, fmt.Errorf("%s user name option %q needs a value of letters, digits, '_' or '+'", preset, key)
		}
		seen[key] = true
		if err := g.set(&s, key, value); err != nil {
			return s, fmt.Errorf("%s user name option %q: %w", preset, key, err)
		}
	}
	for _, k := range g.required {
		if !seen[k] {
			return s, fmt.Errorf("%s user name lacks option %q", preset, k)
		}
	}
	return s, nil
}

func (g grammar) set(s *Session, key, value string) error {
	switch g.fields[key] {
	case fAccount:
		s.Account = value
	case fZone:
		s.Zone = value
	case fGroups:
		s.Groups = value
	case fSession:
		s.ID = value
	case fCountry:
		if len(value) != 2 {
			return fmt.Errorf("%q is not a two-letter country code", clip(value))
		}
		s.Country = strings.ToLower(value)
	case fMinutes:
		n, err := strconv.Atoi(value)
		if err != nil || n < 1 || n > 1440 {
			return fmt.Errorf("%q is not a number of minutes from 1 to 1440", clip(value))
		}
		s.Minutes = n
	}
	return nil
}

func validValue(v string) bool {
	for _, r := range v {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '+') {
			return false
		}
	}
	return true
}

func clip(s string) string {
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}
