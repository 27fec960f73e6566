package service

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newFS() (*flag.FlagSet, *string, *time.Duration) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addr := fs.String("redis-addr", "127.0.0.1:6379", "")
	ttl := fs.Duration("default-ttl", time.Minute, "")
	return fs, addr, ttl
}

func TestParseFlags(t *testing.T) {
	t.Run("environment fills unset flags", func(t *testing.T) {
		t.Setenv("BROKER_REDIS_ADDR", "10.0.0.1:6379")
		fs, addr, _ := newFS()
		require.NoError(t, ParseFlags(fs, "BROKER", nil))
		assert.Equal(t, "10.0.0.1:6379", *addr)
	})
	t.Run("command line wins over environment", func(t *testing.T) {
		t.Setenv("BROKER_REDIS_ADDR", "10.0.0.1:6379")
		fs, addr, _ := newFS()
		require.NoError(t, ParseFlags(fs, "BROKER", []string{"--redis-addr", "127.0.0.2:6379"}))
		assert.Equal(t, "127.0.0.2:6379", *addr)
	})
	t.Run("bad environment value names the variable and the flag", func(t *testing.T) {
		t.Setenv("BROKER_DEFAULT_TTL", "forever")
		fs, _, _ := newFS()
		err := ParseFlags(fs, "BROKER", nil)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "BROKER_DEFAULT_TTL")
		assert.Contains(t, err.Error(), "--default-ttl")
	})
	t.Run("stray argument", func(t *testing.T) {
		fs, _, _ := newFS()
		assert.ErrorContains(t, ParseFlags(fs, "BROKER", []string{"oops"}), `unexpected argument "oops"`)
	})
}
