package cluster

import (
	"archive/zip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
)

// egress runs `kubectl egress` as a user does: the plugin binary on PATH,
// found by the cluster's kubectl, reading the cluster through the
// kubeconfig and the lease API through a port-forward to a broker pod.
func (h *harness) egress(in *install, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin := filepath.Join(h.dir, "plugin")
	full := append([]string{"egress"}, args...)
	full = append(full, "--release", in.release, "--release-namespace", in.ns)
	return run(ctx, h.repo, []string{"PATH=" + bin + ":" + os.Getenv("PATH"), "KUBECONFIG=" + h.kubeconfig}, h.kubectl, full...)
}

func (h *harness) egressJSON(in *install, into any, args ...string) {
	h.t.Helper()
	out, err := h.egress(in, append(args, "-o", "json")...)
	require.NoError(h.t, err)
	require.NoError(h.t, json.Unmarshal([]byte(out), into), out)
}

// pluginStatus is what the test reads of `kubectl egress status -o json`.
type pluginStatus struct {
	Pools []struct {
		Name                                         string
		Proxies, Healthy, Leasable, Leases, Cordoned int
		NotLeasable                                  []struct{ ID, Reason, Why string }
	}
}

func (s pluginStatus) pool(name string) (out struct {
	Proxies, Healthy, Leasable, Leases, Cordoned int
	NotLeasable                                  map[string]string
}) {
	for _, p := range s.Pools {
		if p.Name == name {
			out.Proxies, out.Healthy, out.Leasable, out.Leases, out.Cordoned = p.Proxies, p.Healthy, p.Leasable, p.Leases, p.Cordoned
			out.NotLeasable = map[string]string{}
			for _, m := range p.NotLeasable {
				out.NotLeasable[m.ID] = m.Reason
			}
		}
	}
	return out
}

// plugin runs the kubectl plugin's verbs against the install and its pool
// of 3: status and explain, cordon (no new lease lands on the proxy) and
// uncordon, leases, bans for a target a report cooled, drain and rotate
// (the pool replaces members), check install on the good install and on
// one with its brokers scaled to zero.
func (h *harness) plugin(in *install) {
	t := h.t
	bin := filepath.Join(h.dir, "plugin")
	_, err := run(context.Background(), h.repo, []string{"CGO_ENABLED=0"}, "go", "build", "-o", filepath.Join(bin, "kubectl-egress"), "./clients/kubectl-egress")
	require.NoError(t, err)
	pool := proxiesNS + "/e2e"
	ns := []string{"-n", proxiesNS}

	out, err := h.egress(in, append([]string{"status"}, ns...)...)
	require.NoError(t, err)
	h.logf("kubectl egress status -n %s:\n%s", proxiesNS, out)
	var st pluginStatus
	h.egressJSON(in, &st, append([]string{"status"}, ns...)...)
	p := st.pool(pool)
	assert.Equal(t, 3, p.Proxies, "status: the pool's members")
	assert.Equal(t, 3, p.Healthy)
	assert.Equal(t, 3, p.Leasable, "every member leasable: %v", p.NotLeasable)

	out, err = h.egress(in, append([]string{"explain", "e2e-1"}, ns...)...)
	require.NoError(t, err)
	h.logf("kubectl egress explain e2e-1:\n%s", out)
	var story struct {
		ID, Phase  string
		Conditions []struct{ Type, Status string }
		Brokers    struct{ Proxy struct{ ID string } }
	}
	h.egressJSON(in, &story, append([]string{"explain", "e2e-1"}, ns...)...)
	assert.Equal(t, proxiesNS+"/e2e-1", story.ID)
	assert.Equal(t, "Ready", story.Phase)
	assert.Equal(t, proxiesNS+"/e2e-1", story.Brokers.Proxy.ID, "the brokers' side of the story")

	// cordon --dry-run prints the patch and changes nothing; cordon then
	// keeps every new lease off e2e-0 while the others take them.
	out, err = h.egress(in, append([]string{"cordon", "e2e-0", "--dry-run"}, ns...)...)
	require.NoError(t, err)
	assert.Contains(t, out, `"crawl.example.com/cordoned":"true"`, "the patch is printed")
	assert.Contains(t, out, "dry run")
	assert.NotContains(t, h.member("e2e-0").Annotations, v1alpha1.AnnotationCordoned, "a dry run changes nothing")
	out, err = h.egress(in, append([]string{"cordon", "e2e-0"}, ns...)...)
	require.NoError(t, err, out)
	h.eventually(time.Minute, "status shows e2e-0 cordoned", func() error {
		h.egressJSON(in, &st, append([]string{"status"}, ns...)...)
		if r := st.pool(pool).NotLeasable[proxiesNS+"/e2e-0"]; r != "PROXY_CORDONED" {
			return fmt.Errorf("e2e-0 is %q", r)
		}
		return nil
	})
	c := h.leaser(in)
	var leases []*leaseclient.Lease
	for range 6 {
		l, err := c.Lease(context.Background(), leaseclient.Request{Namespace: proxiesNS, Selector: map[string]string{"geo": "e2e"}, TTL: 5 * time.Minute})
		require.NoError(t, err)
		assert.NotEqual(t, proxiesNS+"/e2e-0", l.Proxy.GetId(), "no new lease on the cordoned proxy")
		leases = append(leases, l)
	}
	var listed struct {
		Leases []struct{ LeaseID, ProxyID string }
	}
	h.egressJSON(in, &listed, append([]string{"leases"}, ns...)...)
	ids := map[string]bool{}
	for _, l := range listed.Leases {
		ids[l.LeaseID] = true
	}
	for _, l := range leases {
		assert.True(t, ids[l.ID], "kubectl egress leases lists lease %s", l.ID)
	}
	out, err = h.egress(in, append([]string{"uncordon", "e2e-0"}, ns...)...)
	require.NoError(t, err, out)
	h.eventually(time.Minute, "e2e-0 leased again once uncordoned", func() error {
		l, err := c.Lease(context.Background(), leaseclient.Request{Namespace: proxiesNS, Selector: map[string]string{"geo": "e2e"}, TTL: 5 * time.Minute})
		if err != nil {
			return err
		}
		leases = append(leases, l)
		if l.Proxy.GetId() != proxiesNS+"/e2e-0" {
			return fmt.Errorf("leased %s", l.Proxy.GetId())
		}
		return nil
	})

	// A rate-limited report cools one exit for a target; bans shows it.
	r, err := leases[0].Report(context.Background(), leaseclient.Outcome{Result: "rate_limited", Target: "bans.e2e.example", StatusCode: 429})
	require.NoError(t, err)
	require.NotNil(t, r.GetCooldownUntil())
	out, err = h.egress(in, append([]string{"bans", "--target", "bans.e2e.example"}, ns...)...)
	require.NoError(t, err)
	h.logf("kubectl egress bans --target bans.e2e.example:\n%s", out)
	var bans struct {
		Target struct {
			Cooling []struct{ ProxyID, EgressIP string }
		}
	}
	h.egressJSON(in, &bans, append([]string{"bans", "--target", "bans.e2e.example"}, ns...)...)
	require.Len(t, bans.Target.Cooling, 1, "one exit cooling for the target")
	assert.Equal(t, leases[0].Proxy.GetId(), bans.Target.Cooling[0].ProxyID)
	for _, l := range leases {
		require.NoError(t, l.Release(context.Background()))
	}

	// check <url>: every member fetches the target, those cooling for it
	// (step 3's reports) too; /ban answers 429, which the default policy
	// calls rate_limited, and exit code 2. No lease is left, and without
	// --report nothing more cools.
	ca := filepath.Join(h.dir, "target-ca.crt")
	require.NoError(t, os.WriteFile(ca, h.targetTLS["ca.crt"], 0o644))
	out, err = h.egress(in, append([]string{"check", targetURL + "/ok", "--pool", "e2e", "--target-ca-file", ca}, ns...)...)
	require.NoError(t, err, out)
	h.logf("kubectl egress check %s/ok --pool e2e:\n%s", targetURL, out)
	var check struct {
		Exits []struct {
			Proxy, Verdict string
			Status         int
		}
	}
	h.egressJSON(in, &check, append([]string{"check", targetURL + "/ok", "--pool", "e2e", "--target-ca-file", ca}, ns...)...)
	require.Len(t, check.Exits, 3, "every member fetched")
	for _, x := range check.Exits {
		assert.Equal(t, "ok", x.Verdict, "%s", x.Proxy)
		assert.Equal(t, 204, x.Status, "%s", x.Proxy)
	}
	targetHost := strings.TrimPrefix(targetURL, "https://")
	h.egressJSON(in, &bans, append([]string{"bans", "--target", targetHost}, ns...)...)
	cooling := len(bans.Target.Cooling)
	out, err = h.egress(in, append([]string{"check", targetURL + "/ban", "--pool", "e2e", "--count", "1", "--target-ca-file", ca}, ns...)...)
	require.Error(t, err, "a rate-limited exit fails the check")
	assert.Contains(t, err.Error(), "exit status 2")
	assert.Contains(t, out, "rate_limited")
	listed.Leases = nil
	h.egressJSON(in, &listed, append([]string{"leases"}, ns...)...)
	assert.Empty(t, listed.Leases, "check releases what it leased")
	h.egressJSON(in, &bans, append([]string{"bans", "--target", targetHost}, ns...)...)
	assert.Len(t, bans.Target.Cooling, cooling, "check without --report cools nothing")

	// check install: the good install passes; with no broker it fails,
	// names what, and exits 2.
	out, err = h.egress(in, "check", "install")
	require.NoError(t, err, out)
	h.logf("kubectl egress check install:\n%s", out)
	broker := in.release + "-broker"
	h.mustKubectl("scale", "deployment", broker, "-n", in.ns, "--replicas=0")
	h.eventually(time.Minute, "no broker pod left", func() error {
		if n := len(h.podsOf(in.ns, "app.kubernetes.io/component=broker")); n > 0 {
			return fmt.Errorf("%d broker pods", n)
		}
		return nil
	})
	out, err = h.egress(in, "check", "install")
	require.Error(t, err, "check install on an install with no broker fails")
	assert.Contains(t, err.Error(), "exit status 2")
	assert.Contains(t, err.Error(), "brokers up")
	assert.Contains(t, err.Error(), "describe deployment "+broker, "and names the fix")
	h.logf("kubectl egress check install, brokers scaled to 0: %v", out)
	h.mustKubectl("scale", "deployment", broker, "-n", in.ns, "--replicas=1")
	h.mustKubectl("rollout", "status", "deployment/"+broker, "-n", in.ns, "--timeout", "2m")

	// report: a zip with the release's logs, and not its token.
	zipFile := filepath.Join(h.dir, "report.zip")
	out, err = h.egress(in, append([]string{"report", "--output-file", zipFile}, ns...)...)
	require.NoError(t, err, out)
	z, err := zip.OpenReader(zipFile)
	require.NoError(t, err)
	token := strings.TrimSpace(string(h.secretData(in.ns, in.release+"-discovery-token", "token")))
	logs := 0
	for _, f := range z.File {
		rc, err := f.Open()
		require.NoError(t, err)
		b, err := io.ReadAll(rc)
		require.NoError(t, err)
		assert.NotContains(t, string(b), token, "%s holds the lease API's token", f.Name)
		if strings.HasPrefix(f.Name, "logs/") {
			logs++
		}
	}
	_ = z.Close()
	assert.GreaterOrEqual(t, logs, 3, "the controller's, probers' and brokers' logs")
	h.logf("kubectl egress report: %d files, %d logs", len(z.File), logs)

	// drain: the pool deletes the member once its leases are gone and
	// makes another.
	before := h.member("e2e-2").UID
	out, err = h.egress(in, append([]string{"drain", "e2e-2", "--drain-timeout", "1m"}, ns...)...)
	require.NoError(t, err, out)
	h.eventually(2*time.Minute, "e2e-2 drained and replaced", func() error {
		var px v1alpha1.Proxy
		err := h.c.Get(context.Background(), client.ObjectKey{Namespace: proxiesNS, Name: "e2e-2"}, &px)
		if err == nil && px.UID == before {
			return fmt.Errorf("e2e-2 is still the drained one")
		}
		return client.IgnoreNotFound(err)
	})
	h.poolAt(3)

	// rotate: every member replaced, make-before-break, and the pool
	// settles with three new ones.
	old := map[string]bool{}
	for _, px := range h.members() {
		old[string(px.UID)] = true
	}
	out, err = h.egress(in, append([]string{"rotate", "e2e"}, ns...)...)
	require.NoError(t, err, out)
	assert.Contains(t, out, `"rolloutAfter"`)
	h.eventually(4*time.Minute, "every member rotated", func() error {
		ms := h.members()
		for _, px := range ms {
			if old[string(px.UID)] {
				return fmt.Errorf("%s not yet replaced", px.Name)
			}
		}
		if len(ms) != 3 {
			return fmt.Errorf("%d members", len(ms))
		}
		return nil
	})
	h.poolAt(3)
	h.egressJSON(in, &st, append([]string{"status"}, ns...)...)
	assert.Equal(t, 3, st.pool(pool).Leasable, "after the rotation every member is leasable again")
	out, err = h.egress(in, append([]string{"status", "e2e"}, ns...)...)
	require.NoError(t, err)
	h.logf("kubectl egress status e2e:\n%s", out)
	assert.Contains(t, out, "ROLLOUT AFTER", "the pool's view names its rotation")
	assert.Regexp(t, `READY\s+True AsDesired`, out, "and its conditions")
}

// member reads one of the pool's Proxies.
func (h *harness) member(name string) *v1alpha1.Proxy {
	h.t.Helper()
	var px v1alpha1.Proxy
	require.NoError(h.t, h.c.Get(context.Background(), client.ObjectKey{Namespace: proxiesNS, Name: name}, &px))
	return &px
}
