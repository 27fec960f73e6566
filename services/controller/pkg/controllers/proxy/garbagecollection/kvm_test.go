package garbagecollection_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/uuid"
	clocktesting "k8s.io/utils/clock/testing"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/controllers/proxy/garbagecollection"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kvm"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kvm/kvmtest"
)

// Orphan GC across two real kvm2 hosts, one of them unreachable: the
// reachable host's orphan is collected, nothing on the unreachable host is
// deleted (its silence is never read as "everything is gone") and the
// sweep names it; once the host is back, its orphan goes too.
func TestSweepAcrossKVMHostsSkipsAnUnreachableOne(t *testing.T) {
	testenv.Require(t)
	ctx := context.Background()
	f := kvmtest.NewFixture(t)
	a, b := f.Host(t, "hv-a", kvmtest.Options{}), f.Host(t, "hv-b", kvmtest.Options{})
	block, err := json.Marshal(f.Config([]*kvmtest.Host{a, b}, nil))
	require.NoError(t, err)
	reg, err := providers.NewRegistry(ctx, []providers.Entry{{Name: "kvm-home", Type: kvm.Type2, Block: block}},
		map[string]providers.Factory{kvm.Type2: kvm.New2}, providers.Deps{Log: slog.Default()})
	require.NoError(t, err)
	prov, err := reg.Get("kvm-home")
	require.NoError(t, err)

	// VMs whose Proxies were never recorded: a create whose status write
	// was lost, and whose Proxy was then deleted.
	orphan := func(h *kvmtest.Host) string {
		o := providers.Owner{UID: uuid.NewUUID(), Namespace: "gc-kvm", Name: "orphan-" + h.Name, Generation: 1}
		inst, err := prov.Create(ctx, &providers.CreateRequest{Name: providers.InstanceName(o.Name, o.UID, 1), Owner: o, Port: 3128,
			Placement: v1.Placement{Zone: h.Name, MachineType: "small", Image: "tiny"}})
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			got, err := prov.Get(ctx, inst.ProviderID)
			return err == nil && got.State == providers.StateRunning
		}, time.Minute, 50*time.Millisecond)
		return inst.Name
	}
	onA, onB := orphan(a), orphan(b)

	b.Cut()
	var logs bytes.Buffer
	clock := clocktesting.NewFakePassiveClock(time.Now().Add(11 * time.Minute))
	gc := garbagecollection.New(reg, env.Client, slog.New(slog.NewTextHandler(&logs, nil)),
		garbagecollection.Options{Interval: time.Hour, Grace: 10 * time.Minute, Clock: clock})
	assert.Equal(t, 1, gc.Sweep(ctx), "only the reachable host's orphan")
	assert.Contains(t, logs.String(), "gc sweep incomplete")
	assert.Contains(t, logs.String(), "kvm host hv-b", "the sweep names the host it could not read")
	assert.False(t, a.HasDomain(t, onA), "the orphan on hv-a is collected")
	assert.True(t, b.HasDomain(t, onB), "nothing on the unreachable host is deleted")

	b.Restore()
	require.Eventually(t, func() bool {
		gc.Sweep(ctx)
		return !b.HasDomain(t, onB)
	}, 30*time.Second, 200*time.Millisecond, "hv-b's orphan is collected once the host answers again")
}
