package gcp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/uuid"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/gcp"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/gcp/fakecompute"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/providertest"
)

func newProvider(t *testing.T, fake *fakecompute.Server, entry string) providers.Provider {
	t.Helper()
	block, _ := json.Marshal(map[string]any{"project": "my-project", "endpoint": fake.URL, "withoutAuthentication": true,
		"networkTag": "proxies", "diskSizeGb": 20})
	p, err := gcp.New(context.Background(), providers.Entry{Name: entry, Type: gcp.Type, Block: block}, providers.Deps{})
	require.NoError(t, err)
	return p
}

func request(name string, o providers.Owner) *providers.CreateRequest {
	return &providers.CreateRequest{Name: name, Owner: o, Port: 3128, CloudInit: []byte("#cloud-config\npackages: [squid]\n"),
		Placement: v1.Placement{Zone: "europe-west1-b", MachineType: "e2-micro", Image: "projects/debian-cloud/global/images/family/debian-12"}}
}

func TestContract(t *testing.T) {
	fake := fakecompute.New()
	defer fake.Close()
	providertest.Run(t, &providertest.Harness{
		Provider: newProvider(t, fake, "gcp-eu"),
		Request:  request,
		CreateUntagged: func(t *testing.T) {
			fake.Put("europe-west1-b", map[string]any{"name": "someone-elses", "status": "RUNNING",
				"labels": map[string]any{"managed-by": "egress-proxies", "egress-proxies-provider": "gcp-eu"}})
		},
	})
}

func owner() providers.Owner {
	return providers.Owner{UID: uuid.NewUUID(), Namespace: "crawl", Name: "eu-1", Generation: 2}
}

func TestCreatePollReadyDeleteAndTheExactInsertBody(t *testing.T) {
	fake := fakecompute.New()
	defer fake.Close()
	p := newProvider(t, fake, "gcp-eu")
	ctx := context.Background()
	o := owner()
	req := request(providers.InstanceName(o.Name, o.UID, 2), o)

	inst, err := p.Create(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, "gcp://my-project/europe-west1-b/"+req.Name, inst.ProviderID)
	assert.Equal(t, providers.StatePending, inst.State, "Create returns once Insert is accepted")

	calls := fake.Calls()
	require.Len(t, calls, 1)
	assert.Equal(t, "POST", calls[0].Method)
	assert.Equal(t, "/compute/v1/projects/my-project/zones/europe-west1-b/instances", calls[0].Path)
	b := calls[0].Body
	assert.Equal(t, req.Name, b["name"])
	assert.Equal(t, "zones/europe-west1-b/machineTypes/e2-micro", b["machineType"])
	disk := b["disks"].([]any)[0].(map[string]any)
	assert.Equal(t, true, disk["boot"])
	assert.Equal(t, true, disk["autoDelete"])
	assert.Equal(t, "projects/debian-cloud/global/images/family/debian-12", disk["initializeParams"].(map[string]any)["sourceImage"])
	assert.Equal(t, "20", fmt.Sprint(disk["initializeParams"].(map[string]any)["diskSizeGb"]))
	nic := b["networkInterfaces"].([]any)[0].(map[string]any)
	assert.Equal(t, "global/networks/default", nic["network"])
	ac := nic["accessConfigs"].([]any)[0].(map[string]any)
	assert.Equal(t, "ONE_TO_ONE_NAT", ac["type"], "one NIC with an ephemeral external IP")
	assert.Equal(t, []any{"proxies"}, b["tags"].(map[string]any)["items"])
	assert.Equal(t, map[string]any{
		"managed-by": "egress-proxies", "egress-proxies-provider": "gcp-eu",
		"egress-proxies-owner-uid": string(o.UID), "egress-proxies-generation": "2",
	}, b["labels"])
	meta := map[string]string{}
	for _, it := range b["metadata"].(map[string]any)["items"].([]any) {
		m := it.(map[string]any)
		meta[m["key"].(string)] = m["value"].(string)
	}
	assert.Equal(t, "#cloud-config\npackages: [squid]\n", meta["user-data"], "cloud-init as user-data")
	assert.Equal(t, "crawl/eu-1", meta["egress-proxies-owner"])

	var got *providers.Instance
	require.Eventually(t, func() bool {
		got, err = p.Get(ctx, inst.ProviderID)
		return err == nil && got.Ready()
	}, 5*time.Second, 10*time.Millisecond, "the reconciler's polling reaches Running")
	assert.True(t, strings.HasPrefix(got.IP, "203.0.113."), "status.ip is the NAT IP, got %q", got.IP)
	assert.Equal(t, o.UID, got.Owner.UID)
	assert.Equal(t, "crawl", got.Owner.Namespace)
	assert.WithinDuration(t, time.Now(), got.CreatedAt, time.Minute, "CreatedAt from creationTimestamp")

	// A retried Insert of the same name (after a crash) is absorbed.
	again, err := p.Create(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, inst.ProviderID, again.ProviderID)
	assert.Equal(t, 1, fake.Len())

	require.NoError(t, p.Delete(ctx, inst.ProviderID))
	_, err = p.Get(ctx, inst.ProviderID)
	assert.True(t, providers.IsNotFound(err))
	require.NoError(t, p.Delete(ctx, inst.ProviderID), "deleting a gone VM is nil")

	methods := []string{}
	for _, c := range fake.Calls() {
		methods = append(methods, c.Method)
	}
	for _, m := range methods {
		assert.Contains(t, []string{"POST", "GET", "DELETE"}, m, "only Insert, Get, Delete (and AggregatedList) are ever called")
	}
}

func TestMissingPlacementFieldIsNamedBeforeAnyCall(t *testing.T) {
	fake := fakecompute.New()
	defer fake.Close()
	p := newProvider(t, fake, "gcp-eu")
	for _, f := range []string{"zone", "machineType", "image"} {
		req := request("px-x-00000000-1", owner())
		switch f {
		case "zone":
			req.Placement.Zone = ""
		case "machineType":
			req.Placement.MachineType = ""
		case "image":
			req.Placement.Image = ""
		}
		_, err := p.Create(context.Background(), req)
		require.Error(t, err)
		assert.True(t, providers.IsInvalidConfig(err))
		assert.Contains(t, err.Error(), "spec.placement."+f)
	}
	assert.Empty(t, fake.Calls(), "validation happens before any API call")
}

func TestErrorKinds(t *testing.T) {
	fake := fakecompute.New()
	defer fake.Close()
	p := newProvider(t, fake, "gcp-eu")
	cases := []struct {
		code            int
		reason, message string
		kind            string
	}{
		{403, "quotaExceeded", "Quota 'CPUS' exceeded.  Limit: 8.0 in region europe-west1.", "quota"},
		{503, "ZONE_RESOURCE_POOL_EXHAUSTED", "The zone 'projects/my-project/zones/europe-west1-b' does not have enough resources available", "quota"},
		{429, "rateLimitExceeded", "Rate Limit Exceeded", "quota"},
		{403, "forbidden", "Required 'compute.instances.create' permission for 'projects/my-project'", "invalid_config"},
		{400, "invalid", "Invalid value for field 'resource.machineType': 'zones/europe-west1-b/machineTypes/e2-giant'", "invalid_config"},
		{500, "backendError", "Internal error", "transient"},
	}
	for _, c := range cases {
		fake.FailNextInsert(c.code, c.reason, c.message)
		_, err := p.Create(context.Background(), request("px-e-00000000-1", owner()))
		require.Error(t, err)
		assert.Equal(t, c.kind, providers.Kind(err), "%d %s", c.code, c.reason)
		if c.kind == "invalid_config" {
			assert.Contains(t, err.Error(), c.message, "terminal errors carry the API's message")
		}
	}
}

func TestListFindsOnlyOurInstancesAcrossZonesAndPages(t *testing.T) {
	fake := fakecompute.New()
	defer fake.Close()
	p := newProvider(t, fake, "gcp-eu")
	ours := map[string]bool{}
	for i, zone := range []string{"europe-west1-b", "europe-west1-b", "europe-west4-a", "europe-west4-a", "europe-west4-a"} {
		name := fmt.Sprintf("px-ours-%d", i)
		ours["gcp://my-project/"+zone+"/"+name] = true
		fake.Put(zone, map[string]any{"name": name, "status": "RUNNING", "labels": map[string]any{
			"managed-by": "egress-proxies", "egress-proxies-provider": "gcp-eu", "egress-proxies-owner-uid": fmt.Sprint(uuid.NewUUID()), "egress-proxies-generation": "1"}})
	}
	fake.Put("europe-west1-b", map[string]any{"name": "other-entry", "labels": map[string]any{
		"managed-by": "egress-proxies", "egress-proxies-provider": "gcp-us", "egress-proxies-owner-uid": "x"}})
	fake.Put("europe-west4-a", map[string]any{"name": "not-ours", "labels": map[string]any{"team": "web"}})
	fake.Put("europe-west4-a", map[string]any{"name": "no-labels"})

	insts, err := p.List(context.Background())
	require.NoError(t, err)
	got := map[string]bool{}
	for _, i := range insts {
		got[i.ProviderID] = true
		assert.False(t, i.CreatedAt.IsZero())
	}
	assert.Equal(t, ours, got)
	pages := 0
	for _, c := range fake.Calls() {
		if strings.HasSuffix(c.Path, "/aggregated/instances") {
			pages++
			assert.Contains(t, c.Query, "filter=")
		}
	}
	assert.Equal(t, 3, pages, "5 instances in pages of 2")
}

func TestMissingCredentialsMakeTheEntryUnavailable(t *testing.T) {
	// Point ADC at a file that does not exist: no metadata server is asked.
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", t.TempDir()+"/absent.json")
	_, err := gcp.New(context.Background(), providers.Entry{Name: "gcp-eu", Type: gcp.Type, Block: []byte(`{"project":"p"}`)}, providers.Deps{})
	require.Error(t, err)
	assert.True(t, providers.IsUnavailable(err), "the manager starts and only this entry's Proxies fail: %v", err)
	assert.Contains(t, err.Error(), "Application Default Credentials")

	_, err = gcp.New(context.Background(), providers.Entry{Name: "gcp-eu", Type: gcp.Type, Block: []byte(`{}`)}, providers.Deps{})
	assert.ErrorContains(t, err, "gcp.project is required")
}
