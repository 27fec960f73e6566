package store

import (
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Key declares one kind of key the broker keeps in Redis: the whole
// layout is Schema, and nothing else writes a key. The scripts build
// every key name from it: script() prepends a Lua table K (each key's
// stem under the prefix, K.Lease == P .. 'lease:') and S (the stem alone,
// for the keys in:<uid> lists), so a key's name is spelled once, here.
// TestEveryKeyIsDeclared (test/suites/broker) runs every API call
// on a real broker and holds
// each key Redis then has to its declaration: pattern, type, and a TTL
// unless it is declared permanent.
type Key struct {
	// Name is the key's field in the scripts' K and S tables.
	Name string
	// Pattern is the key after the prefix; <...> parts vary.
	Pattern string
	// Type is what Redis's TYPE answers.
	Type string
	// Holds says what it holds.
	Holds string
	// Expires says how its TTL is set; empty for a permanent key, whose
	// Permanent says what bounds it instead.
	Expires, Permanent string
	// Writers are the scripts (or Store methods) that write it.
	Writers []string
}

// Stem is the pattern's fixed part: the key's name up to its first
// variable part.
func (k Key) Stem() string {
	if i := strings.IndexByte(k.Pattern, '<'); i >= 0 {
		return k.Pattern[:i]
	}
	return k.Pattern
}

// What bounds the permanent per-proxy keys.
const untilDropped = "one per proxy the brokers know; drop.lua (the Proxy gone) deletes it"

// The keys. A proxy is named by its Proxy's UID, so a Proxy re-created
// under the same name starts clean; every key lives under one hash tag
// (the prefix's), so each script runs in one Cluster slot.
var (
	KeyLease = Key{Name: "Lease", Pattern: "lease:<leaseID>", Type: "hash",
		Holds:     "a live lease: proxy, target, expires, req, addr, ix (its index), at (granted), ct (the target, when counted), sess (its session key), tok (its token's name)",
		Permanent: "ended at its expiry through Due, on Redis's clock, by whichever script runs next (lib.lua drain), or by release",
		Writers:   []string{"acquire.lua", "renew.lua", "report.lua"}}
	KeyProxyLeases = Key{Name: "ProxyLeases", Pattern: "pl:<uid>", Type: "set",
		Holds: "the proxy's live lease ids", Permanent: "empties with the proxy's last lease; drop.lua ends them all",
		Writers: []string{"acquire.lua"}}
	KeyDue = Key{Name: "Due", Pattern: "due", Type: "zset",
		Holds:     `what falls due, by time: "l|<leaseID>|<uid>" at lease expiry, "c|<uid>|<target>" at cooldown end, "q|<uid>|" at quarantine end; every script applies what is due first`,
		Permanent: "one per prefix; each entry leaves when applied",
		Writers:   []string{"acquire.lua", "renew.lua", "report.lua"}}
	KeyRequest = Key{Name: "Request", Pattern: "req:<requestID>", Type: "string",
		Holds:   `"<leaseID>|<fingerprint>" while that lease lives (CreateLease idempotency)`,
		Expires: "at its lease's expiry (PXAT), moved by each renewal",
		Writers: []string{"acquire.lua", "renew.lua"}}
	KeyScore = Key{Name: "Score", Pattern: "score", Type: "hash",
		Holds: "uid -> live lease count * 2^32 + the proxy's slot number", Permanent: "one per prefix; " + untilDropped + "'s field",
		Writers: []string{"join.lua", "acquire.lua", "lib.lua end_lease"}}
	KeyNamespace = Key{Name: "Namespace", Pattern: "ns", Type: "hash",
		Holds: "uid -> the Proxy's namespace", Permanent: "one per prefix; " + untilDropped + "'s field",
		Writers: []string{"join.lua"}}
	KeyAddress = Key{Name: "Address", Pattern: "addr", Type: "hash",
		Holds: "uid -> ip:port", Permanent: "one per prefix; " + untilDropped + "'s field",
		Writers: []string{"join.lua"}}
	KeyCooling = Key{Name: "Cooling", Pattern: "cool:<uid>", Type: "hash",
		Holds: "target -> end of the proxy's cooldown (from its cooldown key's); target#tenant -> end of one an untrusted tenant's reports started for it alone", Permanent: "each field leaves through Due at its end; " + untilDropped,
		Writers: []string{"report.lua", "join.lua"}}
	KeyCooldownKey = Key{Name: "CooldownKey", Pattern: "key", Type: "hash",
		Holds: `uid -> the key its cooldowns are kept under: "ip:<egress IP>", else "p:<uid>"`, Permanent: "one per prefix; " + untilDropped + "'s field",
		Writers: []string{"join.lua"}}
	KeyFiled = Key{Name: "Filed", Pattern: "via:<cooldownKey>", Type: "set",
		Holds: "the uids filed under a cooldown key (proxies sharing an egress IP cool down together)", Permanent: untilDropped,
		Writers: []string{"join.lua"}}
	KeyCooldown = Key{Name: "Cooldown", Pattern: "cd:<cooldownKey>", Type: "hash",
		Holds:   `target (or target#tenant, a tenant's own) -> "<end>|<level>|<start>" of the key's last cooldown (escalation, inheritance)`,
		Expires: "the memory window past its last cooldown's end",
		Writers: []string{"report.lua", "join.lua (a proxy joining a cooling key inherits)"}}
	KeyClaim = Key{Name: "Claim", Pattern: "claim:<cooldownKey>", Type: "hash",
		Holds:   `target -> "<tenant>|<ms>" of the last untrusted tenant's lone ban report on the key, or "*|<ms>" once a second tenant agreed (report weighting)`,
		Expires: "the memory window past its last report",
		Writers: []string{"report.lua"}}
	KeyTarget = Key{Name: "Target", Pattern: "t:<target>", Type: "hash",
		Holds:     "n: live leases for the target; rate, tat, cut, until: its pace",
		Permanent: "each field is deleted when it no longer says anything (no lease, the pace lapsed), and the key with its last",
		Writers:   []string{"acquire.lua", "report.lua", "lib.lua end_lease"}}
	KeyPaced = Key{Name: "Paced", Pattern: "paced", Type: "hash",
		Holds: "target -> pace rate, for metrics", Permanent: "one per prefix; a field per paced target, deleted when its pace ends",
		Writers: []string{"report.lua"}}
	KeySession = Key{Name: "Session", Pattern: "sess:<sessionKey>", Type: "hash",
		Holds:   `a sticky session: proxy, n (live leases), t:<target> -> "<uid>|<index>|<granted>" of its last lease for each target (up to 64)`,
		Expires: "none while a lease holds it; SESSION_LINGER (10 minutes) after its last lease ends",
		Writers: []string{"acquire.lua", "lib.lua end_lease"}}
	KeyErrors = Key{Name: "Errors", Pattern: "errs:<uid>", Type: "zset",
		Holds: "target (target#tenant from an untrusted tenant) -> time of the proxy's error reports in the quarantine window", Expires: "the quarantine window after its last report",
		Writers: []string{"report.lua"}}
	KeyQuarantine = Key{Name: "Quarantine", Pattern: "quar", Type: "hash",
		Holds: `uid -> "<start>|<end>" of quarantined proxies`, Permanent: "one per prefix; a field leaves through Due at its end",
		Writers: []string{"report.lua"}}
	KeyRejoin = Key{Name: "Rejoin", Pattern: "qix:<uid>", Type: "set",
		Holds: "the indexes a quarantined proxy rejoins at its end", Permanent: "deleted when the quarantine ends, through Due",
		Writers: []string{"report.lua"}}
	KeyIndexes = Key{Name: "Indexes", Pattern: "ixs", Type: "hash",
		Holds: "index -> its selector's definition", Permanent: "one per prefix; a field per index, deleted with it (drop.lua, an index idle too long or past the cap)",
		Writers: []string{"join.lua"}}
	KeyIndexUse = Key{Name: "IndexUse", Pattern: "ixused", Type: "zset",
		Holds: "index -> its last use", Permanent: "one per prefix; a member per index, deleted with it",
		Writers: []string{"join.lua", "Store.Touch"}}
	KeyIndex = Key{Name: "Index", Pattern: "ix:<index>", Type: "zset",
		Holds: "uid -> score: the leasable proxies a selector matches", Permanent: "deleted with its index (drop.lua)",
		Writers: []string{"join.lua", "leave.lua", "lib.lua add_load"}}
	KeyCoolingIndex = Key{Name: "CoolingIndex", Pattern: "cx:<index>:<target>", Type: "zset",
		Holds: "the members of ix:<index> cooling down for the target, same scores; for target#tenant, those cooling for that tenant alone and not for everyone", Permanent: "a member leaves as its cooldown ends (through Due); deleted with its index",
		Writers: []string{"report.lua", "join.lua"}}
	KeyCoolingTargets = Key{Name: "CoolingTargets", Pattern: "cxs:<index>", Type: "set",
		Holds: "the targets an index has a cooling index for", Permanent: "a member leaves with its last cooling index; deleted with its index",
		Writers: []string{"report.lua", "join.lua"}}
	KeyHolders = Key{Name: "Holders", Pattern: "in:<uid>", Type: "set",
		Holds: "the ix and cx keys (stems S.Index, S.CoolingIndex) holding the proxy, to move it when its load changes", Permanent: untilDropped,
		Writers: []string{"join.lua", "report.lua", "leave.lua"}}
	KeyTokens = Key{Name: "Tokens", Pattern: "tok", Type: "hash",
		Holds: "tenant name -> its live leases (the per-tenant lease cap)", Permanent: "one per prefix; a field per tenant with a live lease",
		Writers: []string{"acquire.lua", "lib.lua end_lease"}}
	KeyTenantRate = Key{Name: "TenantRate", Pattern: "tr:<tenant>:<minute>", Type: "string",
		Holds: "leases the tenant took in that minute (its leasesPerMinute quota)", Expires: "2 minutes",
		Writers: []string{"acquire.lua"}}
	KeyTenantBytes = Key{Name: "TenantBytes", Pattern: "tb:<tenant>:<day>", Type: "string",
		Holds: "bytes the tenant's gateway tunnels carried that UTC day (its gatewayBytesPerDay quota)", Expires: "2 days",
		Writers: []string{"Store.AddTenantBytes"}}
	KeyTenantSeen = Key{Name: "TenantSeen", Pattern: "seen", Type: "zset",
		Holds: "tenant name -> when a broker last served it (Unix seconds, only moved forward: ZADD GT): its Tenant's status.lastSeen, fleet-wide", Permanent: "one per prefix; a member per tenant that called, removed 30 days after its last call",
		Writers: []string{"Store.Seen"}}
	KeySeq = Key{Name: "Seq", Pattern: "seq", Type: "string",
		Holds: "the counter slot numbers are drawn from", Permanent: "one per prefix",
		Writers: []string{"join.lua"}}
	KeyRefused = Key{Name: "Refused", Pattern: "refused:<minute>", Type: "hash",
		Holds: "index -> leases refused in that minute (unmet demand, fleet-wide)", Expires: "11 minutes (refusalKeep)",
		Writers: []string{"Store.Refused"}}
)

// Schema is every key, in the order docs/components/broker.md lists them
// (generated from it).
var Schema = []Key{
	KeyLease, KeyProxyLeases, KeyDue, KeyRequest, KeyScore, KeyNamespace, KeyAddress,
	KeyCooling, KeyCooldownKey, KeyFiled, KeyCooldown, KeyClaim, KeyTarget, KeyPaced, KeySession,
	KeyErrors, KeyQuarantine, KeyRejoin, KeyIndexes, KeyIndexUse, KeyIndex, KeyCoolingIndex,
	KeyCoolingTargets, KeyHolders, KeyTokens, KeyTenantRate, KeyTenantBytes, KeyTenantSeen, KeySeq, KeyRefused,
}

// luaKeys is the prelude of every script: P, the prefix (KEYS[1] is
// P .. 'due'), S, every stem in one table constructor, and K, which
// prefixes a stem the first time a script names it. Every lease runs the
// prelude, so it builds only the key names the script uses.
var luaKeys = func() string {
	var b strings.Builder
	fmt.Fprintf(&b, "local P = KEYS[1]:sub(1, -%d)\nlocal S = {", len(KeyDue.Pattern)+1)
	for i, k := range Schema {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s = '%s'", k.Name, k.Stem())
	}
	b.WriteString("}\nlocal K = setmetatable({}, {__index = function(t, name) local v = P .. S[name]; rawset(t, name, v); return v end})\n")
	return b.String()
}()

// Match returns the declaration a key (prefix included) is an instance
// of.
func Match(prefix, key string) (Key, bool) {
	for _, k := range Schema {
		if k.pattern(prefix).MatchString(key) {
			return k, true
		}
	}
	return Key{}, false
}

func (k Key) pattern(prefix string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString("^" + regexp.QuoteMeta(prefix))
	rest := k.Pattern
	for {
		i := strings.IndexByte(rest, '<')
		if i < 0 {
			b.WriteString(regexp.QuoteMeta(rest))
			break
		}
		j := strings.IndexByte(rest, '>')
		b.WriteString(regexp.QuoteMeta(rest[:i]) + ".+")
		rest = rest[j+1:]
	}
	return regexp.MustCompile(b.String() + "$")
}

// key names an instance of k: prefix, stem, then parts joined as the
// pattern joins them (only cx:<index>:<target> has two).
func (s *Store) key(k Key, parts ...string) string {
	return s.prefix + k.Stem() + strings.Join(parts, ":")
}

// refusalKeep is how long each minute's refusal counts are kept: every
// broker adds to the same counts, so the controller sees the fleet's
// unmet demand, not one replica's.
const refusalKeep = 11 * time.Minute
