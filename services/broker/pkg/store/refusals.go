package store

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Refusals are counted per selector index in one hash per minute.
func (s *Store) refusalKey(minute int64) string {
	return s.key(KeyRefused, strconv.FormatInt(minute, 10))
}

// Refused counts one lease refused on index at now.
func (s *Store) Refused(ctx context.Context, index string, now time.Time) error {
	key := s.refusalKey(now.Unix() / 60)
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HIncrBy(ctx, key, index, 1)
		p.Expire(ctx, key, refusalKeep)
		return nil
	})
	return wrap(err)
}

// Refusals returns, per index definition, the leases refused in the
// whole minutes that overlap the window ending at now (at most ten).
// Indexes dropped since are left out: nobody leases from them.
func (s *Store) Refusals(ctx context.Context, window time.Duration, now time.Time) (map[string]int64, error) {
	last := now.Unix() / 60
	first := now.Add(-window).Unix() / 60
	first = max(first, last-int64(refusalKeep/time.Minute)+1)
	var minutes []*redis.MapStringStringCmd
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for m := first; m <= last; m++ {
			minutes = append(minutes, p.HGetAll(ctx, s.refusalKey(m)))
		}
		return nil
	}); err != nil {
		return nil, wrap(err)
	}
	counts := map[string]int64{}
	for _, cmd := range minutes {
		for ix, v := range cmd.Val() {
			n, _ := strconv.ParseInt(v, 10, 64)
			counts[ix] += n
		}
	}
	if len(counts) == 0 {
		return counts, nil
	}
	ixs := make([]string, 0, len(counts))
	for ix := range counts {
		ixs = append(ixs, ix)
	}
	defs, err := s.rdb.HMGet(ctx, s.key(KeyIndexes), ixs...).Result()
	if err != nil {
		return nil, wrap(err)
	}
	out := map[string]int64{}
	for i, d := range defs {
		if def, ok := d.(string); ok {
			out[def] += counts[ixs[i]]
		}
	}
	return out, nil
}
