package store

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// Member is a proxy as the indexes know it.
type Member struct {
	UID, Namespace, Addr string
	// EgressIP, when known, files the proxy's cooldowns under its exit IP,
	// shared with every proxy on it and inherited by the next one.
	EgressIP string
	// HealthySince is when the proxy last turned healthy (zero: it is
	// not healthy); a later time than a quarantine's start ends it.
	HealthySince time.Time
}

// CooldownKey is what the member's cooldowns are filed under.
func (m Member) CooldownKey() string {
	if m.EgressIP != "" {
		return "ip:" + m.EgressIP
	}
	return "p:" + m.UID
}

// Join adds members to indexes at their current loads and cooldowns.
// With def set it first registers the one index named (def is its
// definition, for other brokers to read back); otherwise indexes that are
// not registered are skipped.
func (s *Store) Join(ctx context.Context, def string, members []Member, indexes []string) error {
	for lo := 0; lo < len(members); lo += batch {
		chunk := members[lo:min(lo+batch, len(members))]
		args := make([]any, 0, 2+5*len(chunk)+len(indexes))
		args = append(args, def, len(chunk))
		for _, m := range chunk {
			var since int64
			if !m.HealthySince.IsZero() {
				since = m.HealthySince.UnixMilli()
			}
			args = append(args, m.UID, m.Namespace, m.Addr, m.CooldownKey(), since)
		}
		for _, h := range indexes {
			args = append(args, h)
		}
		if err := s.run(ctx, joinScript, args...).Err(); err != nil {
			return wrap(err)
		}
	}
	if len(members) == 0 && def != "" {
		return wrap(s.run(ctx, joinScript, def, 0, indexes[0]).Err())
	}
	return nil
}

// Leave takes a proxy out of indexes (all of them when none are named).
func (s *Store) Leave(ctx context.Context, uid string, indexes ...string) error {
	return s.leave(ctx, uid, "0", indexes)
}

// Forget ends a proxy's leases, takes it out of every index and drops its
// load, cooldowns and number: its Proxy is gone. Its exit IP's cooldown
// record stays, for a proxy that lands on the same IP.
func (s *Store) Forget(ctx context.Context, uid string) error { return s.leave(ctx, uid, "1", nil) }

func (s *Store) leave(ctx context.Context, uid, forget string, indexes []string) error {
	args := make([]any, 0, 2+len(indexes))
	args = append(args, uid, forget)
	for _, h := range indexes {
		args = append(args, h)
	}
	return wrap(s.run(ctx, leaveScript, args...).Err())
}

// Drop removes an index.
func (s *Store) Drop(ctx context.Context, index string) error {
	return wrap(s.run(ctx, dropScript, index).Err())
}

// Index is a registered selector index.
type Index struct {
	Def      string
	LastUsed time.Time
}

// Indexes returns every registered index.
func (s *Store) Indexes(ctx context.Context) (map[string]Index, error) {
	defs, err := s.rdb.HGetAll(ctx, s.key(KeyIndexes)).Result()
	if err != nil {
		return nil, wrap(err)
	}
	used, err := s.rdb.ZRangeWithScores(ctx, s.key(KeyIndexUse), 0, -1).Result()
	if err != nil {
		return nil, wrap(err)
	}
	out := make(map[string]Index, len(defs))
	for h, d := range defs {
		out[h] = Index{Def: d}
	}
	for _, z := range used {
		if ix, ok := out[z.Member.(string)]; ok {
			ix.LastUsed = time.UnixMilli(int64(z.Score))
			out[z.Member.(string)] = ix
		}
	}
	return out, nil
}

// Touch records when indexes were last used, so idle ones can be dropped.
func (s *Store) Touch(ctx context.Context, used map[string]time.Time) error {
	if len(used) == 0 {
		return nil
	}
	zs := make([]redis.Z, 0, len(used))
	for h, t := range used {
		zs = append(zs, redis.Z{Score: float64(t.UnixMilli()), Member: h})
	}
	return wrap(s.rdb.ZAddXX(ctx, s.key(KeyIndexUse), zs...).Err())
}

// Members returns the proxies an index holds.
func (s *Store) Members(ctx context.Context, index string) ([]string, error) {
	m, err := s.rdb.ZRange(ctx, s.key(KeyIndex, index), 0, -1).Result()
	return m, wrap(err)
}

// Known returns every proxy the store keeps state for, with its namespace.
func (s *Store) Known(ctx context.Context) (map[string]string, error) {
	m, err := s.rdb.HGetAll(ctx, s.key(KeyNamespace)).Result()
	return m, wrap(err)
}
