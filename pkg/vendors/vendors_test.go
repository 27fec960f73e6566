package vendors

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

func TestFormatWritesEachVendorsGrammarAndParseReadsItBack(t *testing.T) {
	cases := []struct {
		preset v1.VendorPreset
		s      Session
		want   string
	}{
		{v1.PresetBrightData, Session{Account: "c123", Zone: "resi", ID: "s1", Country: "us"}, "brd-customer-c123-zone-resi-country-us-session-s1"},
		{v1.PresetBrightData, Session{Account: "c123", Zone: "resi", ID: "s1"}, "brd-customer-c123-zone-resi-session-s1"},
		{v1.PresetOxylabs, Session{Account: "acme", ID: "x9", Country: "de", Minutes: 10}, "customer-acme-cc-DE-sessid-x9-sesstime-10"},
		{v1.PresetOxylabs, Session{Account: "acme", ID: "x9"}, "customer-acme-sessid-x9"},
		{v1.PresetDecodo, Session{Account: "u1", ID: "abc", Country: "fr", Minutes: 30}, "user-u1-country-fr-session-abc-sessionduration-30"},
		{v1.PresetApify, Session{Groups: "RESIDENTIAL", ID: "a7", Country: "gb"}, "groups-RESIDENTIAL,session-a7,country-GB"},
		{v1.PresetApify, Session{Groups: "A+B", ID: "a7"}, "groups-A+B,session-a7"},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			got, err := Format(c.preset, "", c.s)
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
			assert.Equal(t, c.preset, Detect(got))
			back, err := Parse(c.preset, got)
			require.NoError(t, err)
			assert.Equal(t, c.s, back)
		})
	}
}

func TestCustomTemplate(t *testing.T) {
	got, err := Format(v1.PresetCustom, "acct7-{session}-geo-{COUNTRY}-{country}", Session{ID: "s3", Country: "nl"})
	require.NoError(t, err)
	assert.Equal(t, "acct7-s3-geo-NL-nl", got)
	assert.Equal(t, v1.VendorPreset(""), Detect(got), "a custom grammar is nobody's preset")
}

func TestParseRefusesWhatAVendorWouldAndSaysWhy(t *testing.T) {
	cases := []struct {
		preset v1.VendorPreset
		user   string
		want   string
	}{
		{v1.PresetBrightData, "customer-c1-zone-z", `must start with "brd-customer-"`},
		{v1.PresetBrightData, "brd-customer-c1-zone-z-city-paris", `option "city" is unknown (options: customer, zone, country, session)`},
		{v1.PresetBrightData, "brd-customer-c1-session-s", `lacks option "zone"`},
		{v1.PresetBrightData, "brd-customer-c1-zone-z-session-a-session-b", `"session" is given twice`},
		{v1.PresetBrightData, "brd-customer-c1-zone-z-session", `"session" needs a value`},
		{v1.PresetBrightData, "brd-customer-c1-zone-z-country-usa", `not a two-letter country code`},
		{v1.PresetOxylabs, "customer-a-sessid-x-sesstime-0", `not a number of minutes`},
		{v1.PresetOxylabs, "customer-a-st-ny", `option "st" is unknown`},
		{v1.PresetDecodo, "user-u-session-a.b", `needs a value of letters`},
		{v1.PresetApify, "groups-R,session-a,asn-1", `option "asn" is unknown`},
		{v1.PresetApify, "session-a", `must start with "groups-"`},
	}
	for _, c := range cases {
		t.Run(c.user, func(t *testing.T) {
			_, err := Parse(c.preset, c.user)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			assert.Contains(t, err.Error(), string(c.preset), "the error names the grammar")
		})
	}
}

func TestDetect(t *testing.T) {
	for user, want := range map[string]v1.VendorPreset{
		"brd-customer-x-zone-y":   v1.PresetBrightData,
		"customer-x-sessid-1":     v1.PresetOxylabs,
		"user-x-session-1":        v1.PresetDecodo,
		"groups-R,session-1":      v1.PresetApify,
		"session=abc,attr.geo=us": "",
		"":                        "",
		"username":                "",
	} {
		assert.Equal(t, want, Detect(user), user)
	}
}
