package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"

	"google.golang.org/grpc/credentials"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"sigs.k8s.io/controller-runtime/pkg/client"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
)

// brokerPort is the brokers' gRPC port in their pods.
const brokerPort = 9090

// install is what the plugin learned of the release's brokers.
type install struct {
	deployment *appsv1.Deployment
	// tlsSecret is the Secret of the brokers' certificate; "" without TLS.
	tlsSecret string
}

func (e *env) brokerDeployment(ctx context.Context) (*install, error) {
	var d appsv1.Deployment
	key := client.ObjectKey{Namespace: e.releaseNS, Name: e.release + "-broker"}
	if err := e.kube.Get(ctx, key, &d); err != nil {
		return nil, fmt.Errorf("finding the brokers (Deployment %s): %w; name the install with --release and --release-namespace, or the lease API with --broker", key, err)
	}
	in := &install{deployment: &d}
	for _, c := range d.Spec.Template.Spec.Containers {
		if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--tls-cert-file") }) {
			for _, v := range d.Spec.Template.Spec.Volumes {
				if v.Name == "tls" && v.Secret != nil {
					in.tlsSecret = v.Secret.SecretName
				}
			}
			if in.tlsSecret == "" {
				in.tlsSecret = "?"
			}
		}
	}
	return in, nil
}

// leaseAPI dials the lease API: --broker, or a port-forward to a ready
// broker pod, with TLS when the brokers serve it and the release's token
// unless one was given.
func (e *env) leaseAPI(ctx context.Context) (leasev1.LeaseServiceClient, func(), error) {
	c, done, err := e.leaseClient(ctx)
	if err != nil {
		return nil, nil, err
	}
	return c.API(), done, nil
}

// leaseClient is leaseAPI's connection as the Go client, for verbs that
// lease.
func (e *env) leaseClient(ctx context.Context) (*leaseclient.Client, func(), error) {
	var in *install
	if e.broker == "" || e.caFile == "" || e.token == "" {
		var err error
		if in, err = e.brokerDeployment(ctx); err != nil && e.broker == "" {
			return nil, nil, err
		}
	}
	var opts []leaseclient.Option
	token := e.token
	if token == "" {
		var s corev1.Secret
		key := client.ObjectKey{Namespace: e.releaseNS, Name: e.release + "-discovery-token"}
		if err := e.kube.Get(ctx, key, &s); err != nil {
			return nil, nil, fmt.Errorf("reading the lease API's token (Secret %s): %w; give one with --token or $EGRESS_PROXIES_TOKEN", key, err)
		}
		token = strings.TrimSpace(string(s.Data["token"]))
		e.token = token // the next dial reuses it, and a report scrubs it
	}
	if token != "" {
		opts = append(opts, leaseclient.WithToken(token))
	}
	if in != nil && in.tlsSecret != "" || e.caFile != "" {
		creds, err := e.brokerTLS(ctx, in)
		if err != nil {
			return nil, nil, err
		}
		opts = append(opts, leaseclient.WithTLS(creds))
	} else if err := e.plaintextAllowed(); err != nil {
		return nil, nil, err
	}
	addr, stop := e.broker, func() {}
	if addr == "" {
		var err error
		if addr, stop, err = e.portForward(ctx, in); err != nil {
			return nil, nil, err
		}
	}
	c, err := leaseclient.Dial(addr, opts...)
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("dialing the lease API at %s: %w", addr, err)
	}
	return c, func() { _ = c.Close(); stop() }, nil
}

// plaintextAllowed refuses to send a token in plaintext to a --broker
// off this machine unless --insecure says so: a typo in the address would
// otherwise hand the cluster's token to whoever answers it. Loopback (a
// port-forward of one's own) stays on this machine.
func (e *env) plaintextAllowed() error {
	if e.broker == "" || e.insecure {
		return nil
	}
	host, _, err := net.SplitHostPort(e.broker)
	if err != nil {
		return fmt.Errorf("--broker %q is not host:port: %w", e.broker, err)
	}
	if ip, err := netip.ParseAddr(host); (err == nil && ip.IsLoopback()) || host == "localhost" {
		return nil
	}
	return fmt.Errorf("--broker %s is off this machine and no TLS is configured (the brokers serve none, or no --ca-file was given): the token would cross the network in plaintext; give --ca-file, or --insecure to send it anyway", e.broker)
}

func (e *env) brokerTLS(ctx context.Context, in *install) (credentials.TransportCredentials, error) {
	var ca []byte
	var err error
	switch {
	case e.caFile != "":
		if ca, err = os.ReadFile(e.caFile); err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
	case in != nil && in.tlsSecret != "?":
		var s corev1.Secret
		key := client.ObjectKey{Namespace: e.releaseNS, Name: in.tlsSecret}
		if err := e.kube.Get(ctx, key, &s); err != nil {
			return nil, fmt.Errorf("reading the brokers' CA (Secret %s, key ca.crt): %w; give it with --ca-file", key, err)
		}
		if ca = s.Data["ca.crt"]; len(ca) == 0 {
			return nil, fmt.Errorf("the brokers' TLS Secret %s has no ca.crt: give their CA with --ca-file", key)
		}
	default:
		return nil, fmt.Errorf("the brokers serve TLS from a Secret this plugin cannot name: give their CA with --ca-file")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("the brokers' CA holds no PEM certificate")
	}
	name := e.serverName
	if name == "" {
		name = e.release + "-broker-grpc." + e.releaseNS + ".svc"
	}
	return credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: name, MinVersion: tls.VersionTLS12}), nil
}

// portForward forwards a free loopback port to a ready broker pod's gRPC
// port, as kubectl port-forward does, and returns its address.
func (e *env) portForward(ctx context.Context, in *install) (string, func(), error) {
	sel, err := metav1.LabelSelectorAsSelector(in.deployment.Spec.Selector)
	if err != nil {
		return "", nil, err
	}
	var pods corev1.PodList
	if err := e.kube.List(ctx, &pods, client.InNamespace(e.releaseNS), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return "", nil, fmt.Errorf("listing the broker pods: %w", err)
	}
	var pod *corev1.Pod
	for i := range pods.Items {
		if p := &pods.Items[i]; p.DeletionTimestamp == nil && ready(p) {
			pod = p
			break
		}
	}
	if pod == nil {
		return "", nil, fmt.Errorf("no broker pod of Deployment %s/%s is ready: kubectl -n %s describe deployment %s", e.releaseNS, in.deployment.Name, e.releaseNS, in.deployment.Name)
	}
	transport, upgrader, err := spdy.RoundTripperFor(e.restConfig)
	if err != nil {
		return "", nil, err
	}
	u, err := portForwardURL(e.restConfig.Host, pod)
	if err != nil {
		return "", nil, err
	}
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	stopCh, readyCh := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", brokerPort)}, stopCh, readyCh, io.Discard, io.Discard)
	if err != nil {
		return "", nil, err
	}
	errCh := make(chan error, 1)
	go func() { errCh <- fw.ForwardPorts() }()
	select {
	case <-readyCh:
	case err := <-errCh:
		return "", nil, fmt.Errorf("port-forwarding to broker pod %s: %w", pod.Name, err)
	case <-ctx.Done():
		close(stopCh)
		return "", nil, ctx.Err()
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) == 0 {
		close(stopCh)
		return "", nil, fmt.Errorf("port-forwarding to broker pod %s: no local port: %v", pod.Name, err)
	}
	return net.JoinHostPort("127.0.0.1", fmt.Sprint(ports[0].Local)), func() { close(stopCh) }, nil
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// portForwardURL is the pod's portforward subresource on the API server.
func portForwardURL(host string, pod *corev1.Pod) (*url.URL, error) {
	u, err := url.Parse(host)
	if err != nil {
		return nil, fmt.Errorf("the kubeconfig's server %q: %w", host, err)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/api/v1/namespaces/" + pod.Namespace + "/pods/" + pod.Name + "/portforward"
	return u, nil
}
