package assignment

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
)

// grpcDefaultMaxRecv is grpc-go's default receive limit (4 MiB).
const grpcDefaultMaxRecv = 4 << 20

func targets(n, urlLen int) []*probev1.ProbeTarget {
	url := "https://target.example/" + strings.Repeat("a", max(urlLen-23, 0))
	out := make([]*probev1.ProbeTarget, n)
	for i := range out {
		out[i] = &probev1.ProbeTarget{Id: fmt.Sprintf("namespace-%03d/proxy-%06d", i%100, i), Uid: fmt.Sprintf("%036d", i), Address: "127.0.0.1", Port: 3128,
			Settings: &probev1.ProbeSettings{Url: url, ExpectedStatus: 204, Interval: durationpb.New(30e9), Timeout: durationpb.New(10e9)}}
	}
	return out
}

func TestSplitKeepsEveryMessageFarBelowTheReceiveLimit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		n, url  int
		atLeast int
	}{
		{"50,000 targets at typical URLs", 50000, 40, 2},
		{"50,000 targets at the longest URL the CRD admits", 50000, 2048, 100},
		{"one target", 1, 2048, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := targets(tc.n, tc.url)
			whole := proto.Size(&probev1.Assignment{Full: true, Upsert: in})
			msgs := Split(true, in, nil, 0)
			require.GreaterOrEqual(t, len(msgs), tc.atLeast, "one message of %d bytes would be %d", whole, len(msgs))
			seen := 0
			for i, m := range msgs {
				assert.LessOrEqual(t, proto.Size(m), MaxMessageBytes+perElement, "message %d", i)
				assert.Less(t, proto.Size(m), grpcDefaultMaxRecv)
				assert.Equal(t, i == 0, m.GetFull(), "only the first chunk starts the replacement")
				assert.Equal(t, i < len(msgs)-1, m.GetMore(), "every chunk but the last says more follows")
				seen += len(m.GetUpsert())
			}
			assert.Equal(t, tc.n, seen)
		})
	}
}

func TestSplitEdgeCases(t *testing.T) {
	empty := Split(true, nil, []string{"ignored"}, 0)
	require.Len(t, empty, 1, "an empty set is still an assignment")
	assert.True(t, empty[0].GetFull())
	assert.Empty(t, empty[0].GetRemove(), "a full assignment has nothing to remove")
	assert.False(t, empty[0].GetMore())

	assert.Empty(t, Split(false, nil, nil, 0), "an empty delta sends nothing")

	removes := make([]string, 20000)
	for i := range removes {
		removes[i] = fmt.Sprintf("%0200d", i)
	}
	deltas := Split(false, targets(3, 10), removes, 256<<10)
	require.Greater(t, len(deltas), 1)
	n := 0
	for _, d := range deltas {
		assert.False(t, d.GetFull())
		assert.False(t, d.GetMore(), "each chunk of a delta stands alone")
		assert.LessOrEqual(t, proto.Size(d), 256<<10+perElement)
		n += len(d.GetRemove())
	}
	assert.Equal(t, len(removes), n)
}

func TestAssemblerAppliesAFullAssignmentOnlyWhole(t *testing.T) {
	in := targets(5000, 2048)
	msgs := Split(true, in, nil, 64<<10)
	require.Greater(t, len(msgs), 3)
	var a Assembler
	for i, m := range msgs[:len(msgs)-1] {
		assert.Nil(t, a.Add(m), "chunk %d completes nothing", i)
		assert.True(t, a.Open())
	}
	whole := a.Add(msgs[len(msgs)-1])
	require.NotNil(t, whole)
	assert.False(t, a.Open())
	assert.True(t, whole.GetFull())
	require.Len(t, whole.GetUpsert(), len(in))
	for i := range in {
		assert.Same(t, in[i], whole.GetUpsert()[i], "order and targets are kept")
	}

	delta := &probev1.Assignment{Remove: []string{"x"}}
	assert.Same(t, delta, a.Add(delta), "a delta outside a run passes through")
}

func TestAssemblerRestartsOnANewFullAndMergesWhatContinuesARun(t *testing.T) {
	var a Assembler
	ts := targets(4, 10)
	assert.Nil(t, a.Add(&probev1.Assignment{Full: true, More: true, Upsert: ts[:2]}))
	// A stream that broke mid-run starts over with a new full assignment.
	assert.Nil(t, a.Add(&probev1.Assignment{Full: true, More: true, Upsert: ts[2:3]}))
	got := a.Add(&probev1.Assignment{Upsert: ts[3:], Remove: []string{ts[2].GetId()}})
	require.NotNil(t, got)
	require.Len(t, got.GetUpsert(), 1)
	assert.Equal(t, ts[3].GetId(), got.GetUpsert()[0].GetId())
}

func TestRendezvousSpreadsEvenly(t *testing.T) {
	probers := []string{"prober-0", "prober-1", "prober-2", "prober-3"}
	counts := map[string]int{}
	for i := range 10000 {
		counts[Owner(probers, fmt.Sprintf("ns/proxy-%d", i))]++
	}
	for _, p := range probers {
		assert.InDelta(t, 2500, counts[p], 250, "%s got %d of 10000", p, counts[p])
	}
}
