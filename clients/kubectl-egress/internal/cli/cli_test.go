package cli

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
)

var api *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &api)) }

// plugin runs the plugin against the envtest API server, with the lease
// API at a closed port (the cluster-side verbs need none), and returns
// its exit code and output.
func plugin(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	kc, err := api.WriteKubeconfig(t.TempDir())
	require.NoError(t, err)
	var out, errOut bytes.Buffer
	code := Main(append(args, "--kubeconfig", kc, "--broker", "127.0.0.1:1", "--token", "t", "--timeout", "20s"), &out, &errOut)
	return code, out.String(), errOut.String()
}

func get(t *testing.T, ns, name string) *v1.Proxy {
	var px v1.Proxy
	require.NoError(t, api.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &px))
	return &px
}

// Every verb that changes something prints the merge patch it applies;
// --dry-run has the API server check it and store nothing.
func TestMutationsPrintTheirPatchAndDryRunChangesNothing(t *testing.T) {
	ns := api.Namespace(t, "plugin")
	api.ReadyProxy(t, ns, "p", "127.0.0.10", 3128, nil, true)

	code, out, _ := plugin(t, "cordon", "p", "-n", ns, "--dry-run")
	require.Equal(t, 0, code)
	assert.Contains(t, out, `kubectl patch Proxy p -n `+ns+` --type=merge -p '{"metadata":{"annotations":{"crawl.example.com/cordoned":"true"}}}' (dry run: nothing changes)`)
	assert.NotContains(t, get(t, ns, "p").Annotations, v1.AnnotationCordoned)

	code, _, _ = plugin(t, "cordon", "p", "-n", ns)
	require.Equal(t, 0, code)
	assert.Equal(t, "true", get(t, ns, "p").Annotations[v1.AnnotationCordoned])
	code, out, _ = plugin(t, "uncordon", "p", "-n", ns)
	require.Equal(t, 0, code)
	assert.Contains(t, out, `{"crawl.example.com/cordoned":null}`, "a merge patch's null removes the annotation")
	assert.NotContains(t, get(t, ns, "p").Annotations, v1.AnnotationCordoned)

	code, _, _ = plugin(t, "drain", "p", "-n", ns, "--drain-timeout", "2m")
	require.Equal(t, 0, code)
	deadline, ok := get(t, ns, "p").DrainDeadline()
	require.True(t, ok)
	assert.WithinDuration(t, time.Now().Add(2*time.Minute), deadline, 5*time.Second)

	pool := &v1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: ns},
		Spec: v1.ProxyPoolSpec{Replicas: ptr.To[int32](0), Template: v1.ProxyTemplate{Spec: v1.ProxyTemplateSpec{Provider: "kubernetes"}}}}
	require.NoError(t, api.Client.Create(context.Background(), pool))
	before := time.Now()
	code, out, _ = plugin(t, "rotate", "pool", "-n", ns)
	require.Equal(t, 0, code, out)
	require.NoError(t, api.Client.Get(context.Background(), client.ObjectKeyFromObject(pool), pool))
	require.NotNil(t, pool.Spec.RolloutAfter)
	assert.True(t, pool.Spec.RolloutAfter.After(before.Truncate(time.Second)), "the next whole second: %s", pool.Spec.RolloutAfter)
	assert.WithinDuration(t, before, pool.Spec.RolloutAfter.Time, 2*time.Second)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cordon", "missing", "-n", ns}, `reading Proxy ` + ns + `/missing: proxies.crawl.example.com "missing" not found`},
		{[]string{"drain", "p", "-n", ns, "--drain-timeout", "0s"}, "--drain-timeout must be positive"},
		{[]string{"status", "-o", "xml"}, `--output "xml": use json or yaml`},
		{[]string{"bans"}, "--target is required"},
	} {
		code, _, errOut := plugin(t, tc.args...)
		assert.Equal(t, 1, code, "%v", tc.args)
		assert.Contains(t, errOut, tc.want, "%v", tc.args)
	}
}

// Without the brokers, status still shows the fleet from the cluster,
// says the brokers could not be asked, and tells why each proxy is not
// leasable from the cluster alone.
func TestStatusWithoutTheBrokers(t *testing.T) {
	ns := api.Namespace(t, "plugin")
	api.ReadyProxy(t, ns, "good", "127.0.0.11", 3128, nil, true)
	api.ReadyProxy(t, ns, "sick", "127.0.0.12", 3128, nil, false)
	api.ReadyProxy(t, ns, "cordoned", "127.0.0.13", 3128, nil, true)
	px := get(t, ns, "cordoned")
	px.Annotations = map[string]string{v1.AnnotationCordoned: "true"}
	require.NoError(t, api.Client.Update(context.Background(), px))

	code, out, _ := plugin(t, "status", "-n", ns, "-o", "json")
	require.Equal(t, 0, code, out)
	var v statusView
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	assert.Contains(t, v.Brokers, "ListProxies", "it says the brokers could not be asked")
	require.Len(t, v.Pools, 1)
	p := v.Pools[0]
	assert.Equal(t, noPool, p.Name)
	assert.Equal(t, 3, p.Proxies)
	assert.Equal(t, 2, p.Healthy)
	assert.Equal(t, 1, p.Leasable)
	reasons := map[string]string{}
	for _, m := range p.NotLeasable {
		reasons[m.ID] = m.Reason
	}
	assert.Equal(t, map[string]string{ns + "/sick": "PROXY_UNHEALTHY", ns + "/cordoned": "PROXY_CORDONED"}, reasons)

	code, out, _ = plugin(t, "status", "-n", ns)
	require.Equal(t, 0, code)
	assert.Contains(t, out, "the brokers could not be asked")
	assert.Contains(t, out, "kubectl egress uncordon cordoned -n "+ns, "the fix is a command")
}

// report writes a zip of what a bug report needs and nothing secret:
// every inline cloud-init (a Proxy's, a ProxyPool template's) and a
// source URL's user name and password are redacted, and no Secret is
// read.
func TestReportRedacts(t *testing.T) {
	ns := api.Namespace(t, "plugin")
	px := &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: ns}, Spec: v1.ProxySpec{Mode: v1.ModeManaged, Provider: "gcp",
		CloudInit: &v1.CloudInit{Inline: "#cloud-config\nchpasswd: {list: 'root:hunter2hunter2'}"}}}
	require.NoError(t, api.Client.Create(context.Background(), px))
	pool := &v1.ProxyPool{}
	require.NoError(t, yaml.Unmarshal([]byte(`
metadata: {name: vms}
spec:
  replicas: 0
  template:
    spec:
      provider: gcp
      cloudInit:
        inline: |
          #cloud-config
          ssh_authorized_keys:
            - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPoolKeyPoolKey ops
`), pool))
	pool.Namespace = ns
	require.NoError(t, api.Client.Create(context.Background(), pool))
	src := &v1.ProxySource{ObjectMeta: metav1.ObjectMeta{Name: "list", Namespace: ns},
		Spec: v1.ProxySourceSpec{URL: &v1.SourceURL{URL: "https://lister:listpass99@lists.example/proxies"}}}
	require.NoError(t, api.Client.Create(context.Background(), src))
	file := filepath.Join(t.TempDir(), "report.zip")
	code, out, errOut := plugin(t, "report", "-n", ns, "--output-file", file)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "wrote "+file)
	z, err := zip.OpenReader(file)
	require.NoError(t, err)
	defer z.Close()
	files := map[string]string{}
	for _, f := range z.File {
		rc, err := f.Open()
		require.NoError(t, err)
		b, err := io.ReadAll(rc)
		require.NoError(t, err)
		files[f.Name] = string(b)
	}
	for _, name := range []string{"version.txt", "status.json", "check-install.json", "objects/proxies.yaml", "objects/proxypools.yaml", "release/deployments.yaml"} {
		assert.Contains(t, files, name)
	}
	assert.Contains(t, files["objects/proxies.yaml"], "name: vm")
	assert.Contains(t, files["objects/proxypools.yaml"], "name: vms")
	assert.Contains(t, files["objects/proxysources.yaml"], "https://lists.example/proxies")
	for name, body := range files {
		assert.NotContains(t, body, "hunter2hunter2", "%s carries the cloud-init's password", name)
		assert.NotContains(t, body, "PoolKeyPoolKey", "%s carries the pool template's SSH key", name)
		assert.NotContains(t, body, "listpass99", "%s carries the source URL's password", name)
	}
	assert.Contains(t, files["check-install.json"], `"ok": false`, "the install's faults are in it")
	code, _, errOut = plugin(t, "report", "-n", ns, "--output-file", file)
	assert.Equal(t, 1, code, "an existing file is not overwritten")
	assert.Contains(t, errOut, "file exists")
}

func TestRedactorScrubs(t *testing.T) {
	r := redactor{known: []string{"s3cr3t-token-value"}}
	for in, want := range map[string]string{
		`Authorization: Bearer abc.def`:       `Authorization: Bearer [REDACTED]`,
		`the token s3cr3t-token-value leaked`: `the token [REDACTED] leaked`,
		`{"password":"hunter2"}`:              `{"password":"[REDACTED]"}`,
		`redis://u:pw@x token=abc&x=1`:        `redis://x token=[REDACTED]&x=1`,
		`nothing here`:                        `nothing here`,
	} {
		assert.Equal(t, want, string(r.scrub([]byte(in))), in)
	}
}

// --broker off this machine without TLS is refused before any byte is
// sent, unless --insecure says so; loopback needs no flag.
func TestPlaintextToARemoteBrokerIsRefused(t *testing.T) {
	cases := []struct {
		broker   string
		insecure bool
		want     string
	}{
		{broker: "typo.example:9090", want: "--broker typo.example:9090 is off this machine and no TLS is configured"},
		{broker: "10.0.0.7:9090", want: "give --ca-file, or --insecure"},
		{broker: "typo.example:9090", insecure: true},
		{broker: "127.0.0.1:9090"},
		{broker: "[::1]:9090"},
		{broker: "localhost:9090"},
		{broker: "no-port", want: `--broker "no-port" is not host:port`},
	}
	kc, err := api.WriteKubeconfig(t.TempDir())
	require.NoError(t, err)
	var out, errOut bytes.Buffer
	code := Main([]string{"leases", "-A", "--kubeconfig", kc, "--broker", "typo.example:9090", "--token", "t"}, &out, &errOut)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut.String(), "is off this machine and no TLS is configured", "the verb refuses before dialing")
	for _, c := range cases {
		e := &env{broker: c.broker, insecure: c.insecure}
		err := e.plaintextAllowed()
		if c.want == "" {
			assert.NoError(t, err, c.broker)
		} else {
			assert.ErrorContains(t, err, c.want, c.broker)
		}
	}
}
