package store

import (
	"context"
	_ "embed"
	"strconv"
	"strings"
	"time"
)

//go:embed inspect.lua
var inspectSrc string

var inspectScript = script(reads, inspectSrc)

// LiveLease is a live lease as an operator sees it.
type LiveLease struct {
	ID, Proxy, Target string
	// Tenant holds it; Session is the session key as the tenant gave it.
	Tenant, Session  string
	Granted, Expires time.Time
}

// Cooldown is one running cooldown of a proxy's exit.
type Cooldown struct {
	// Target it is for; Tenant is set when it holds for that tenant alone.
	Target, Tenant string
	Until, Since   time.Time
	Level          int
	// Key is what it is kept under (KeyCooldownKey's values).
	Key string
}

// Leases returns each proxy's (by UID) live leases.
func (s *Store) Leases(ctx context.Context, proxies []string) (map[string][]LiveLease, error) {
	out := make(map[string][]LiveLease, len(proxies))
	err := s.inspect(ctx, "leases", "", "", proxies, func(uid string, r []any) {
		for i := 0; i+5 < len(r); i += 6 {
			l := LiveLease{ID: r[i].(string), Proxy: uid, Target: r[i+1].(string), Tenant: r[i+2].(string),
				Granted: millis(r[i+4]), Expires: millis(r[i+5])}
			// Session keys are stored under their tenant (access.Scoped).
			l.Session = strings.TrimPrefix(r[i+3].(string), l.Tenant+"/")
			out[uid] = append(out[uid], l)
		}
	})
	return out, err
}

// Cooldowns returns each proxy's running cooldowns: for target (every
// target when empty), the fleet's and tenant's own ("*": every
// tenant's; "": none).
func (s *Store) Cooldowns(ctx context.Context, target, tenant string, proxies []string) (map[string][]Cooldown, error) {
	out := make(map[string][]Cooldown, len(proxies))
	err := s.inspect(ctx, "cooldowns", target, tenant, proxies, func(uid string, r []any) {
		for i := 0; i+4 < len(r); i += 5 {
			c := Cooldown{Until: millis(r[i+1]), Level: int(r[i+2].(int64)), Since: millis(r[i+3]), Key: r[i+4].(string)}
			c.Target, c.Tenant, _ = strings.Cut(r[i].(string), "#")
			out[uid] = append(out[uid], c)
		}
	})
	return out, err
}

func (s *Store) inspect(ctx context.Context, what, target, tenant string, proxies []string, each func(uid string, r []any)) error {
	for lo := 0; lo < len(proxies); lo += batch {
		chunk := proxies[lo:min(lo+batch, len(proxies))]
		args := make([]any, 0, len(chunk)+3)
		args = append(args, what, target, tenant)
		for _, p := range chunk {
			args = append(args, p)
		}
		res, err := s.run(ctx, inspectScript, args...).Slice()
		if err != nil {
			return wrap(err)
		}
		for i, uid := range chunk {
			each(uid, res[i].([]any))
		}
	}
	return nil
}

func millis(v any) time.Time {
	if ms, _ := v.(int64); ms > 0 {
		return time.UnixMilli(ms)
	}
	return time.Time{}
}

// ErrorReport is one error report counting toward a quarantine.
type ErrorReport struct {
	Target, Tenant string
	At             time.Time
}

// Errors returns the proxy's error reports in the quarantine window,
// newest first.
func (s *Store) Errors(ctx context.Context, uid string) ([]ErrorReport, error) {
	zs, err := s.rdb.ZRevRangeWithScores(ctx, s.prefix+KeyErrors.Stem()+uid, 0, 99).Result()
	if err != nil {
		return nil, wrap(err)
	}
	out := make([]ErrorReport, 0, len(zs))
	for _, z := range zs {
		e := ErrorReport{At: time.UnixMilli(int64(z.Score))}
		e.Target, e.Tenant, _ = strings.Cut(z.Member.(string), "#")
		out = append(out, e)
	}
	return out, nil
}

// TargetState is a target's fleet-wide state.
type TargetState struct {
	// Leases is its live leases.
	Leases int
	// Pace is its lease rate while paced (0: not), until PacedUntil.
	Pace       float64
	PacedUntil time.Time
}

// Target returns target's live leases and pace.
func (s *Store) Target(ctx context.Context, target string) (TargetState, error) {
	v, err := s.rdb.HMGet(ctx, s.prefix+KeyTarget.Stem()+target, "n", "rate", "until").Result()
	if err != nil {
		return TargetState{}, wrap(err)
	}
	var t TargetState
	if n, ok := v[0].(string); ok {
		t.Leases, _ = strconv.Atoi(n)
	}
	r, _ := v[1].(string)
	u, _ := v[2].(string)
	ms, _ := strconv.ParseInt(u, 10, 64)
	// A pace lapses at its until; the next script to touch it deletes it.
	if until := time.UnixMilli(ms); r != "" && until.After(time.Now()) {
		t.Pace, _ = strconv.ParseFloat(r, 64)
		t.PacedUntil = until
	}
	return t, nil
}
