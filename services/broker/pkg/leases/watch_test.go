package leases_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/internal/brokertest"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/leases"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/policy"
)

// stream is a WatchProxies server stream as gRPC gives one to a handler:
// its context ends once the handler returns. Each batch goes to got; a
// stream that stops reading (stuck) holds every Send from its first, as
// flow control does with a client that never reads.
type stream struct {
	caller access.Caller
	ctx    context.Context
	cancel context.CancelFunc
	got    chan *leasev1.WatchProxiesResponse
	stuck  bool
}

func newStream(caller string, stuck bool) *stream {
	ctx, cancel := context.WithCancel(context.Background())
	return &stream{caller: access.Caller{Tenant: &access.Tenant{Name: caller}}, ctx: ctx, cancel: cancel, got: make(chan *leasev1.WatchProxiesResponse, 64), stuck: stuck}
}

func (s *stream) Send(r *leasev1.WatchProxiesResponse) error {
	if s.stuck {
		<-s.ctx.Done()
		return s.ctx.Err()
	}
	select {
	case s.got <- r:
		return nil
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

func (s *stream) Context() context.Context     { return s.ctx }
func (s *stream) SetHeader(metadata.MD) error  { return nil }
func (s *stream) SendHeader(metadata.MD) error { return nil }
func (s *stream) SetTrailer(metadata.MD)       {}
func (s *stream) SendMsg(m any) error          { return s.Send(m.(*leasev1.WatchProxiesResponse)) }
func (s *stream) RecvMsg(any) error            { return nil }

// watch runs WatchProxies on s as gRPC does: the stream's context ends
// when the handler returns, whose error comes on the channel.
func watch(svc *leases.Service, s *stream) <-chan error {
	done := make(chan error, 1)
	go func() {
		err := svc.WatchProxies(s.caller, &leasev1.WatchProxiesRequest{}, s)
		s.cancel()
		done <- err
	}()
	return done
}

func watchService(t *testing.T, cfg leases.Config) (*brokertest.Stack, *leases.Service) {
	s := brokertest.New(t, env, nil)
	svc := leases.New(s.Inv, s.Store, s.Index, &policy.Policies{Defaults: leases.DefaultPolicy}, cfg)
	go svc.RunWatches(t.Context())
	return s, svc
}

// A watcher that never reads (its sends held by flow control) is ended
// within cfg.WatchSendTimeout: its handler returns, which ends the held send,
// and neither its goroutine nor its batches stay pinned.
func TestAWatcherThatNeverReadsIsEnded(t *testing.T) {
	cfg := leases.DefaultConfig
	cfg.WatchSendTimeout = 300 * time.Millisecond
	s, svc := watchService(t, cfg)
	s.Proxy(t, "w0", "127.0.0.121", nil)
	var done <-chan error
	require.Eventually(t, func() bool {
		done = watch(svc, newStream("reader", true))
		select {
		case err := <-done:
			return status.Code(err) != codes.Unavailable // not synced yet
		case <-time.After(50 * time.Millisecond):
			return true
		}
	}, 10*time.Second, 20*time.Millisecond)
	select {
	case err := <-done:
		assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
		assert.Contains(t, status.Convert(err).Message(), "took no batch for 300ms")
	case <-time.After(10 * time.Second):
		t.Fatal("the never-reading watcher was never ended")
	}
}

// One token holds at most its --token-max-watches; another token's, and
// a freed slot, are not refused.
func TestWatchesAreCappedPerToken(t *testing.T) {
	cfg := leases.DefaultConfig
	cfg.TokenMaxWatches = 2
	s, svc := watchService(t, cfg)
	s.Proxy(t, "w1", "127.0.0.122", nil)
	first := newStream("team", false)
	d1 := watch(svc, first)
	require.Eventually(t, func() bool {
		select {
		case <-first.got:
			return true
		case err := <-d1:
			first = newStream("team", false)
			d1 = watch(svc, first)
			return err == nil
		case <-time.After(10 * time.Millisecond):
			return false
		}
	}, 10*time.Second, 20*time.Millisecond, "the first watch never started")
	second := newStream("team", false)
	d2 := watch(svc, second)
	<-second.got
	third := watch(svc, newStream("team", false))
	err := <-third
	code, reason := reasonOf(err)
	assert.Equal(t, codes.ResourceExhausted, code)
	assert.Equal(t, "TOKEN_WATCH_CAP", reason)
	assert.Contains(t, status.Convert(err).Message(), `tenant "team" holds its 2 watches on this broker (--token-max-watches)`)

	other := newStream("other-team", false)
	dOther := watch(svc, other)
	<-other.got
	first.cancel() // the client leaves
	assert.NoError(t, <-d1)
	again := newStream("team", false)
	dAgain := watch(svc, again)
	<-again.got
	for _, s := range []*stream{second, other, again} {
		s.cancel()
	}
	for _, d := range []<-chan error{d2, dOther, dAgain} {
		assert.NoError(t, <-d)
	}
}

// A thousand watches each get every change of their set, from one
// read of its lease state.
func TestAThousandWatchesFanOut(t *testing.T) {
	s, svc := watchService(t, leases.DefaultConfig)
	s.Proxy(t, "f0", "127.0.0.123", nil)
	const n = 1000
	streams := make([]*stream, n)
	dones := make([]<-chan error, n)
	for i := range streams {
		streams[i] = newStream(fmt.Sprintf("token-%d", i%50), false)
		dones[i] = watch(svc, streams[i])
	}
	// Each starts with the fleet, then the synced mark.
	for i, st := range streams {
		for synced := false; !synced; {
			select {
			case r := <-st.got:
				evs := r.GetEvents()
				synced = evs[len(evs)-1].GetType() == leasev1.ProxyEvent_TYPE_SYNCED
			case err := <-dones[i]:
				t.Fatalf("watch %d ended: %v", i, err)
			}
		}
	}
	s.Proxy(t, "f1", "127.0.0.124", nil)
	timeout := time.After(30 * time.Second)
	for i, st := range streams {
		// f0's own later changes (its status settling) may come first.
		for heard := false; !heard; {
			select {
			case r := <-st.got:
				for _, ev := range r.GetEvents() {
					assert.Equal(t, leasev1.ProxyEvent_TYPE_UPSERT, ev.GetType())
					heard = heard || strings.HasSuffix(ev.GetProxy().GetId(), "/f1")
				}
			case <-timeout:
				t.Fatalf("watch %d never heard of the new proxy", i)
			}
		}
	}
	for i, st := range streams {
		st.cancel()
		assert.NoError(t, <-dones[i])
	}
}

// A watch is authorised again every WatchReauthorize: a credential
// removed ends it Unauthenticated, and a tenant whose namespaces or
// selector changed ends it PermissionDenied, each while it streams.
func TestAWatchEndsWhenItsCredentialOrScopeChanges(t *testing.T) {
	cases := []struct {
		name string
		now  func() (*access.Tenant, error)
		code codes.Code
		msg  string
	}{
		{"credential removed", func() (*access.Tenant, error) {
			return nil, status.Error(codes.Unauthenticated, "invalid bearer token")
		},
			codes.Unauthenticated, "invalid bearer token"},
		{"namespaces narrowed", func() (*access.Tenant, error) {
			return &access.Tenant{Name: "team", Namespaces: []string{"elsewhere"}, Verbs: []access.Verb{access.Watch}}, nil
		}, codes.PermissionDenied, `tenant "team"'s namespaces or selector changed since this watch began`},
		{"selector narrowed", func() (*access.Tenant, error) {
			return &access.Tenant{Name: "team", Selector: map[string]string{"team": "a"}, Verbs: []access.Verb{access.Watch}}, nil
		}, codes.PermissionDenied, "watch again to see its scope now"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var changed atomic.Bool
			cfg := leases.DefaultConfig
			cfg.WatchReauthorize = 100 * time.Millisecond
			cfg.Reauthorize = func(access.Caller) (access.Caller, error) {
				if changed.Load() {
					t, err := c.now()
					return access.Caller{Tenant: t}, err
				}
				return access.Caller{Tenant: &access.Tenant{Name: "team", Verbs: []access.Verb{access.Watch}}}, nil
			}
			s, svc := watchService(t, cfg)
			s.Proxy(t, "r0", "127.0.0.131", nil)
			st := newStream("team", false)
			var done <-chan error
			require.Eventually(t, func() bool {
				st = newStream("team", false)
				done = watch(svc, st)
				select {
				case <-st.got:
					return true
				case <-done:
					return false // not synced yet
				}
			}, 10*time.Second, 20*time.Millisecond)
			select {
			case err := <-done:
				t.Fatalf("the watch ended before its scope changed: %v", err)
			case <-time.After(500 * time.Millisecond):
			}
			changed.Store(true)
			go func() {
				for range st.got {
				}
			}()
			select {
			case err := <-done:
				assert.Equal(t, c.code, status.Code(err), "%v", err)
				assert.Contains(t, status.Convert(err).Message(), c.msg)
			case <-time.After(30 * time.Second):
				t.Fatal("the watch outlived its credential's change")
			}
		})
	}
}
