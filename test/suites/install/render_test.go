package install

import (
	"context"
	cryptotls "crypto/tls"
	"crypto/x509"
	"debug/elf"
	"encoding/pem"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
)

// A parent chart passes global values to its subcharts, and every
// provider type the README documents is accepted.
func TestChartTakesGlobalsAndEveryProviderType(t *testing.T) {
	testenv.Require(t)
	for _, typ := range []string{"kubernetes", "gcp", "kvm", "kvm2"} {
		out, err := helm(t, "template", "ep", chart, "--set", "global.someParentValue=1",
			"--set", "controller.providers[0].name=p", "--set", "controller.providers[0].type="+typ)
		assert.NoError(t, err, "%s: %s", typ, out)
	}
}

func TestChartCRDsAreTheGeneratedOnes(t *testing.T) {
	for _, f := range []string{"crawl.example.com_proxies.yaml", "crawl.example.com_proxypools.yaml"} {
		a, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "deploy", "crds", f))
		require.NoError(t, err)
		b, err := os.ReadFile(filepath.Join(chart, "files", "crds", f))
		require.NoError(t, err)
		assert.Equal(t, string(a), string(b), "make manifests writes both from one source")
	}
	_, err := os.Stat(filepath.Join(chart, "crds"))
	assert.True(t, os.IsNotExist(err), "no crds/ directory: Helm would install it once and never upgrade it")
}

func TestSamplesAreAccepted(t *testing.T) {
	testenv.Require(t)
	matches, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "deploy", "samples", "proxy*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, matches)
	assert.Contains(t, matches, filepath.Join(testenv.RepoRoot(), "deploy", "samples", "proxypool.yaml"))
	matches = append(matches, filepath.Join(testenv.RepoRoot(), "deploy", "samples", "targetpolicy.yaml"))
	for _, m := range matches {
		b, err := os.ReadFile(m)
		require.NoError(t, err)
		u := &unstructured.Unstructured{}
		require.NoError(t, utilyaml.Unmarshal(b, &u.Object))
		u.SetNamespace("default")
		assert.NoError(t, env.Client.Create(context.Background(), u, client.DryRunAll), filepath.Base(m))
		// A Managed sample with cloud-init makes no open proxy: its
		// Squid asks for the credentials the controller places.
		if ci, ok, _ := unstructured.NestedString(u.Object, "spec", "cloudInit", "inline"); ok {
			creds := proxyauth.Credentials{Username: "ep-user", Password: "pw"}
			out := string(creds.Expand([]byte(ci)))
			assert.Contains(t, out, `"$u" = "ep-user" ] && [ "$p" = "pw" ]`, filepath.Base(m))
			assert.Contains(t, out, "acl egress_authenticated proxy_auth REQUIRED", filepath.Base(m))
			assert.NotContains(t, out, "http_access allow all", filepath.Base(m))
		}
	}
}

// The Dockerfiles copy CGO_ENABLED=0 binaries into a distroless static
// image: they must have no dynamic loader to find there.
func TestBinariesBuildStatically(t *testing.T) {
	testenv.Require(t)
	for _, s := range []string{"controller", "prober", "broker"} {
		out := filepath.Join(t.TempDir(), s)
		cmd := exec.Command("go", "build", "-trimpath", "-o", out, "./services/"+s+"/cmd/"+s)
		cmd.Dir = testenv.RepoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		b, err := cmd.CombinedOutput()
		require.NoError(t, err, string(b))
		f, err := elf.Open(out)
		require.NoError(t, err)
		assert.Nil(t, f.Section(".interp"), "%s has a dynamic loader", s)
		for _, p := range f.Progs {
			assert.NotEqual(t, elf.PT_INTERP, p.Type, s)
		}
		_ = f.Close()
	}
	df, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "Dockerfile"))
	require.NoError(t, err)
	assert.Contains(t, string(df), "CGO_ENABLED=0")
	assert.Contains(t, string(df), "distroless/static")
	assert.Contains(t, string(df), "version.Commit=${GIT_COMMIT}")
	assert.Contains(t, string(df), "./services/${SERVICE}/cmd/${SERVICE}", "one Dockerfile, the service a build argument")
	dup, _ := filepath.Glob(filepath.Join(testenv.RepoRoot(), "services", "*", "Dockerfile"))
	assert.Empty(t, dup, "no per-service copies")
}

// make deploy renders the chart with helm template, which cannot look up
// existing Secrets; hack/deploy-secrets.sh makes the probe token and the
// probe TLS Secret once, so a second deploy changes neither, and the
// certificate it makes names the probe Service and verifies with its CA.
func TestDeploySecretsAreMadeOnce(t *testing.T) {
	testenv.Require(t)
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl is not installed; make deploy needs it, and this test runs the script make deploy runs")
	}
	ctx := context.Background()
	dns := env.Namespace(t, "deploy-secrets")
	kc, err := env.WriteKubeconfig(t.TempDir())
	require.NoError(t, err)
	run := func() {
		cmd := exec.Command("bash", filepath.Join(testenv.RepoRoot(), "hack", "deploy-secrets.sh"), dns, "egress-proxies")
		cmd.Env = append(os.Environ(), "KUBECONFIG="+kc)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, string(out))
	}
	get := func(name string) *corev1.Secret {
		s := &corev1.Secret{}
		require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: dns, Name: name}, s))
		return s
	}
	run()
	token, tls := get("egress-proxies-probe-token"), get("egress-proxies-probe-tls")
	discovery, redis := get("egress-proxies-discovery-token"), get("egress-proxies-redis")
	assert.Len(t, token.Data["token"], 48)
	assert.Len(t, discovery.Data["token"], 48)
	assert.Len(t, get("egress-proxies-gateway-token").Data["token"], 48)
	assert.Len(t, redis.Data["password"], 48)
	assert.Len(t, get("egress-proxies-proxy-credentials-key").Data["key"], 48)
	assert.Equal(t, corev1.SecretTypeTLS, tls.Type)
	run()
	assert.Equal(t, token.Data, get("egress-proxies-probe-token").Data, "a second deploy keeps the token")
	assert.Equal(t, discovery.Data, get("egress-proxies-discovery-token").Data, "the lease API's token")
	assert.Equal(t, redis.Data, get("egress-proxies-redis").Data, "Redis's password")
	assert.Equal(t, tls.Data, get("egress-proxies-probe-tls").Data, "and the certificate")

	block, _ := pem.Decode(tls.Data["tls.crt"])
	require.NotNil(t, block)
	cert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(tls.Data["ca.crt"]))
	for _, name := range []string{"egress-proxies-controller-probe", "egress-proxies-controller-probe." + dns + ".svc"} {
		_, err := cert.Verify(x509.VerifyOptions{DNSName: name, Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		assert.NoError(t, err, name)
	}
	_, err = cryptotls.X509KeyPair(tls.Data["tls.crt"], tls.Data["tls.key"])
	assert.NoError(t, err, "the key matches the certificate")

	// make deploy's render names exactly what the script made: applied
	// beside those Secrets, every pod finds what it mounts. It renders no
	// hook: applied as a plain Job, the pre-delete hook would delete every
	// Proxy in the cluster on each deploy.
	out, err := helm(t, "template", "egress-proxies", chart, "--namespace", dns, "-f", filepath.Join(testenv.RepoRoot(), "hack", "deploy-values.yaml"), "--no-hooks")
	require.NoError(t, err, out)
	objs := decode(t, out)
	for _, u := range objs {
		assert.NotEqual(t, "Secret", u.GetKind(), "make deploy renders no Secret (%s): helm template would mint a new one on every apply", u.GetName())
		assert.NotContains(t, u.GetAnnotations(), "helm.sh/hook", "make deploy renders no hook (%s %s)", u.GetKind(), u.GetName())
	}
	assert.Equal(t, 4, applyAndCheckMounts(t, dns, objs), "controller, prober, broker, Redis")
	makefile, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "Makefile"))
	require.NoError(t, err)
	for _, line := range strings.Split(string(makefile), "\n") {
		if strings.Contains(line, "$(HELM) template") {
			assert.Contains(t, line, "--no-hooks", "the Makefile renders as this test does: %s", line)
		}
	}
}

// The default install, applied for real, starts: every Secret and
// ConfigMap a workload mounts or reads env from is rendered by the chart
// itself (or the reference is optional), so no pod waits in
// ContainerCreating for something the user was never told to make.
func TestDefaultInstallMountsOnlyWhatExists(t *testing.T) {
	testenv.Require(t)
	ctx := context.Background()
	ins := env.Namespace(t, "default-install")
	out, err := helm(t, "template", "ep", chart, "--namespace", ins)
	require.NoError(t, err, out)
	objs := decode(t, out)
	assert.Equal(t, 7, applyAndCheckMounts(t, ins, objs), "controller, prober, broker, Redis, the CRD and uninstall hooks and the helm test")

	// And the default is secure: the lease API wants a token, and Redis a
	// password the brokers are given.
	broker := find(t, objs, "Deployment", "ep-broker")
	args := podSpec(t, broker).Containers[0].Args
	assert.Contains(t, args, "--token-file=/etc/egress-proxies/discovery-token/token")
	assert.Contains(t, args, "--redis-password-file=/etc/egress-proxies/redis/password")
	assert.Contains(t, args, "--proxy-credentials-key-file=/etc/egress-proxies/proxy-credentials/key", "Managed proxies are no open proxies")
	assert.Contains(t, podSpec(t, find(t, objs, "Deployment", "ep-controller")).Containers[0].Args, "--proxy-credentials-key-file=/etc/egress-proxies/proxy-credentials/key")
	var token corev1.Secret
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ins, Name: "ep-discovery-token"}, &token))
	assert.Len(t, token.Data["token"], 48)
	// The gateway's password is a gateway-only token of its own, never
	// the discovery token (which may lease and inspect).
	assert.Contains(t, args, "--gateway-token-file=/etc/egress-proxies/gateway-token/token")
	var gwToken corev1.Secret
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ins, Name: "ep-gateway-token"}, &gwToken))
	assert.Len(t, gwToken.Data["token"], 48)
	assert.NotEqual(t, token.Data, gwToken.Data)
	var kinds []string
	for _, u := range objs {
		if u.GetKind() == "NetworkPolicy" {
			kinds = append(kinds, u.GetName())
		}
	}
	assert.ElementsMatch(t, []string{"ep-controller", "ep-prober", "ep-broker", "ep-redis", "ep-proxies"}, kinds, "NetworkPolicies are on by default")

	// Redis's password is on no command line and in no environment but
	// the readiness probe's: Redis reads it from its config file.
	redisPod := podSpec(t, find(t, objs, "StatefulSet", "ep-redis")).Containers[0]
	assert.Equal(t, "/etc/egress-proxies/redis-auth/redis.conf", redisPod.Args[0])
	assert.NotContains(t, strings.Join(redisPod.Args, " "), "requirepass")
	for _, e := range redisPod.Env {
		assert.NotEqual(t, "REDIS_PASSWORD", e.Name)
	}
	var pw corev1.Secret
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ins, Name: "ep-redis"}, &pw))
	assert.Equal(t, "requirepass "+string(pw.Data["password"])+"\n", string(pw.Data["redis.conf"]), "one password, two forms")
	assert.Contains(t, redisPod.Args, "noeviction", "a full Redis refuses, it never evicts a lease")
}

// applyAndCheckMounts applies a render's namespaced objects server-side in
// ns, then checks that every Secret and ConfigMap a workload mounts or
// reads env from exists (or the reference is optional), as a kubelet
// would need it to; it returns how many workloads it checked.
func applyAndCheckMounts(t *testing.T, ns string, objs []*unstructured.Unstructured) int {
	t.Helper()
	ctx := context.Background()
	workloads := 0
	for _, u := range objs {
		if u.GetNamespace() == "" {
			continue // cluster-wide (RBAC, CRDs): other tests' on this API server
		}
		require.NoError(t, env.Client.Patch(ctx, u, client.Apply, client.FieldOwner("chart-test"), client.ForceOwnership), "%s %s", u.GetKind(), u.GetName())
	}
	exists := func(kind, name string) bool {
		var obj client.Object = &corev1.Secret{}
		if kind == "ConfigMap" {
			obj = &corev1.ConfigMap{}
		}
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj) == nil
	}
	for _, u := range objs {
		if !slices.Contains([]string{"Deployment", "StatefulSet", "Job", "Pod"}, u.GetKind()) {
			continue
		}
		workloads++
		pod := podSpec(t, u)
		for _, v := range pod.Volumes {
			switch {
			case v.Secret != nil:
				assert.True(t, exists("Secret", v.Secret.SecretName) || ptr.Deref(v.Secret.Optional, false),
					"%s mounts Secret %s, which the install does not make", u.GetName(), v.Secret.SecretName)
			case v.ConfigMap != nil:
				assert.True(t, exists("ConfigMap", v.ConfigMap.Name) || ptr.Deref(v.ConfigMap.Optional, false),
					"%s mounts ConfigMap %s, which the install does not make", u.GetName(), v.ConfigMap.Name)
			}
		}
		for _, c := range pod.Containers {
			for _, e := range c.Env {
				if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil {
					assert.True(t, exists("Secret", r.SecretKeyRef.Name), "%s reads env %s from Secret %s, which the install does not make", u.GetName(), e.Name, r.SecretKeyRef.Name)
				}
			}
		}
	}
	return workloads
}

// Each knob a well-kept chart has reaches the pod it is set for.
func TestEveryComponentTakesTheCommonKnobs(t *testing.T) {
	testenv.Require(t)
	objs := render(t, abs([]string{"-f", "testdata/all-on.yaml"})...)
	ctl := podSpec(t, find(t, objs, "Deployment", "ep-controller"))
	assert.Equal(t, "registry.example.com/mirror/team/ctl@sha256:0000000000000000000000000000000000000000000000000000000000000000", ctl.Containers[0].Image,
		"the repository as given, under the global registry, pinned by digest")
	assert.Equal(t, map[string]string{"pool": "system"}, ctl.NodeSelector)
	assert.Equal(t, "dedicated", ctl.Tolerations[0].Key)
	assert.NotNil(t, ctl.Affinity.PodAntiAffinity)
	assert.Equal(t, "topology.kubernetes.io/zone", ctl.TopologySpreadConstraints[0].TopologyKey)
	assert.Equal(t, "system-cluster-critical", ctl.PriorityClassName)
	assert.Nil(t, ctl.SecurityContext.RunAsUser, "the component's own pod security context replaces the chart's (OpenShift assigns UIDs)")
	assert.Contains(t, ctl.Containers[0].Args, "--gc-interval=10m")
	assert.Contains(t, ctl.Containers[0].Env, corev1.EnvVar{Name: "OTEL_EXPORTER_OTLP_ENDPOINT", Value: "http://otel-collector:4317"})
	assert.Contains(t, ctl.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "extra", MountPath: "/extra"})
	assert.Equal(t, []corev1.LocalObjectReference{{Name: "mirror-pull"}}, ctl.ImagePullSecrets)
	ctlDep := find(t, objs, "Deployment", "ep-controller")
	labels, _, _ := unstructured.NestedStringMap(ctlDep.Object, "spec", "template", "metadata", "labels")
	ann, _, _ := unstructured.NestedStringMap(ctlDep.Object, "spec", "template", "metadata", "annotations")
	assert.Equal(t, "crawl", labels["team"])
	assert.Equal(t, "crawl", ann["team"])
	assert.Contains(t, ann, "checksum/providers", "the chart's own annotations stay")
	sa := find(t, objs, "ServiceAccount", "ep-controller")
	assert.Equal(t, "proxies@my-project.iam.gserviceaccount.com", sa.GetAnnotations()["iam.gke.io/gcp-service-account"], "GKE Workload Identity")

	brk := podSpec(t, find(t, objs, "Deployment", "ep-broker"))
	assert.Equal(t, "registry.example.com/mirror/egress-proxies-broker:v9.9.9", brk.Containers[0].Image)
	assert.Equal(t, []corev1.LocalObjectReference{{Name: "mirror-pull"}, {Name: "broker-pull"}}, brk.ImagePullSecrets)
	assert.Equal(t, int64(65532), *brk.SecurityContext.RunAsUser, "the chart's restricted default")
	assert.Contains(t, brk.Containers[0].Args, "--tls-cert-file=/etc/egress-proxies/tls/tls.crt")
	assert.Contains(t, brk.Containers[0].Args, "--token-file=/etc/egress-proxies/discovery-token/token")
	var tokenVol *corev1.Volume
	for i, v := range brk.Volumes {
		if v.Name == "discovery-token" {
			tokenVol = &brk.Volumes[i]
		}
	}
	require.NotNil(t, tokenVol)
	assert.Equal(t, "crawler-token", tokenVol.Secret.SecretName, "a Secret the user made keeps its name")
	cert := find(t, objs, "Certificate", "ep-broker")
	dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	assert.Contains(t, dns, "ep-broker-grpc."+ns+".svc")
	assert.Contains(t, dns, "ep-discovery-service."+ns+".svc")

	prb := podSpec(t, find(t, objs, "Deployment", "ep-prober"))
	assert.Equal(t, map[string]string{"pool": "probers"}, prb.NodeSelector)
	assert.Contains(t, prb.Containers[0].Env, corev1.EnvVar{Name: "OTEL_SERVICE_NAME", Value: "prober-eu"})
}

func decode(t *testing.T, out string) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
	return objs
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, u := range objs {
		if u.GetKind() == kind && u.GetName() == name {
			return u
		}
	}
	require.FailNow(t, "not rendered", "%s %s", kind, name)
	return nil
}

func podSpec(t *testing.T, u *unstructured.Unstructured) corev1.PodSpec {
	t.Helper()
	var pod corev1.PodSpec
	path := []string{"spec", "template", "spec"}
	if u.GetKind() == "Pod" {
		path = []string{"spec"}
	}
	raw, _, _ := unstructured.NestedMap(u.Object, path...)
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &pod))
	return pod
}
