package health

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/auth"
	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
	"github.com/egress-proxies/egress-proxies/pkg/kube"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
	"github.com/egress-proxies/egress-proxies/pkg/service"
)

var (
	probersConnected = prometheus.NewGauge(prometheus.GaugeOpts{Name: "proxy_operator_probers_connected", Help: "Probers connected to this (leader) controller."})
	assignments      = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "proxy_operator_probe_assignments", Help: "Proxies assigned to each connected prober."}, []string{"prober"})
	reassigned       = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_probe_reassignments_total", Help: "Proxies moved from one prober to another by rebalancing."})
	rejected         = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_probe_results_rejected_total",
		Help: "Probe results refused: about a proxy not assigned to the sending stream (unassigned; a moved proxy's late result is one), or malformed (invalid).",
	}, []string{"reason"})
)

// grpcMetrics are the probe endpoint's grpc_server_* series.
var grpcMetrics = service.NewGRPCMetrics()

// Hub serves the probe stream and keeps the assignment: every probe-able
// Proxy belongs to exactly one connected prober, chosen by rendezvous
// hashing, so a prober arriving or leaving moves only its own share. The
// informer's events and the probers' comings and goings mark what changed;
// one rebalancer turns the marks into per-prober changes, and each prober's
// own sender sends them, so a slow prober delays nobody else and a burst of
// changes to one proxy reaches its prober once.
type Hub struct {
	probev1.UnimplementedProbeServiceServer
	engine *Engine
	// elected is closed once this replica leads; followers refuse streams
	// so probers find the leader.
	elected <-chan struct{}
	log     *slog.Logger
	opts    HubOptions

	mu      sync.Mutex
	targets map[string]*probev1.ProbeTarget
	owner   map[string]string // target id -> prober id
	// dirty: target ids added, changed or removed since the last rebalance.
	dirty map[string]struct{}
	// regroup: the set of probers changed, so every owner is recomputed.
	regroup  bool
	sessions map[string]*session
	kick     chan struct{}
	listener net.Listener
}

// HubOptions configure the probe endpoint.
type HubOptions struct {
	// Addr is where the endpoint listens (--probe-addr).
	Addr string
	// TLS serves the stream over TLS; nil serves plaintext (local
	// development and tests of the hub alone).
	TLS   *tls.Config
	Token *auth.Token
	// Defaults resolve each Proxy's spec.healthCheck.
	Defaults Defaults
	// Deny lists where a proxy may not be: a Proxy whose address is in
	// it is refused (ProbeDenied), not assigned.
	Deny netpolicy.DenyList
	// Egress is where a health-check URL may point: a Proxy's creator
	// names it, and the probe fleet would fetch it through the proxy.
	Egress netpolicy.Egress
	// Credentials gives each target the credentials its proxy asks for;
	// without Secrets, External proxies are probed with none.
	Credentials kube.ProxyCredentials
	// MaxMessageBytes bounds one assignment message; 0 means
	// assignment.MaxMessageBytes.
	MaxMessageBytes int
}

// NewHub returns a hub that hands results to engine and serves probers
// once elected is closed (nil: at once).
func NewHub(engine *Engine, elected <-chan struct{}, log *slog.Logger, o HubOptions) *Hub {
	return &Hub{
		engine: engine, elected: elected, log: log, opts: o,
		targets: map[string]*probev1.ProbeTarget{}, sessions: map[string]*session{}, owner: map[string]string{}, dirty: map[string]struct{}{},
		kick: make(chan struct{}, 1),
	}
}

// NeedLeaderElection is false: followers must run to refuse streams.
func (h *Hub) NeedLeaderElection() bool { return false }

// Watch feeds the target set from the manager's Proxy informer.
func (h *Hub) Watch(ctx context.Context, c cache.Cache) error {
	inf, err := c.GetInformer(ctx, &v1.Proxy{})
	if err != nil {
		return err
	}
	_, err = inf.AddEventHandler(kube.ProxyEvents(h.upsert, func(px *v1.Proxy) { h.remove(px.Key(), px.UID) }))
	return err
}

// probeable: an address exists and the lifecycle says the instance runs.
func probeable(px *v1.Proxy) bool {
	return px.DeletionTimestamp.IsZero() && px.Status.IP != "" && px.Status.Port != 0 && px.Status.Phase == v1.PhaseReady
}

func (h *Hub) upsert(px *v1.Proxy) {
	id := px.Key()
	if !probeable(px) {
		h.drop(id)
		h.engine.Reset(px)
		return
	}
	r := h.opts.Defaults.Resolve(px.Spec.HealthCheck)
	addr := fmt.Sprintf("%s:%d", px.Status.IP, px.Status.Port)
	if why := h.denied(px.Status.IP, r.URL); why != "" {
		h.engine.Refuse(px, addr, why)
		h.drop(id)
		return
	}
	h.engine.Track(px, addr, r)
	t := &probev1.ProbeTarget{Id: id, Uid: string(px.UID), Address: px.Status.IP, Port: px.Status.Port, Settings: r.Proto()}
	if c := h.credentials(px); !c.Empty() {
		t.Credentials = &probev1.ProxyCredentials{Username: c.Username, Password: c.Password}
	}
	h.mu.Lock()
	// Most informer events are status writes that leave the target as it
	// was: those cost a comparison, not a message.
	if old, ok := h.targets[id]; !ok || !proto.Equal(old, t) {
		h.targets[id] = t
		h.dirty[id] = struct{}{}
		h.trigger()
	}
	h.mu.Unlock()
}

// credentials are what px's proxy asks for, or none. A missing or
// malformed Secret probes without any: the proxy's 407 becomes the
// Healthy condition's message, which is where the user looks.
func (h *Hub) credentials(px *v1.Proxy) proxyauth.Credentials {
	// Bounded: the Secret cache may still be syncing; its add events
	// bring the credentials to the targets that wait for them.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := h.opts.Credentials.Of(ctx, kube.CredentialsRefOf(px))
	if err != nil {
		h.log.Debug("probing without credentials", "proxy", px.Key(), "err", err)
	}
	return c
}

// WatchCredentials re-sends the targets whose credentials Secret changed,
// came or went; proxies lists their Proxies.
func (h *Hub) WatchCredentials(ctx context.Context, secrets cache.Cache, proxies client.Reader) error {
	inf, err := secrets.GetInformer(ctx, &corev1.Secret{})
	if err != nil {
		return err
	}
	changed := func(obj any) {
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		s, ok := obj.(*corev1.Secret)
		if !ok {
			return
		}
		var list v1.ProxyList
		if err := proxies.List(ctx, &list, client.InNamespace(s.Namespace)); err != nil {
			h.log.Warn("listing the Proxies a credentials Secret serves", "secret", s.Namespace+"/"+s.Name, "err", err)
			return
		}
		for i := range list.Items {
			if ref := list.Items[i].Spec.CredentialsSecretRef; ref != nil && ref.Name == s.Name {
				h.upsert(&list.Items[i])
			}
		}
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: changed, UpdateFunc: func(_, n any) { changed(n) }, DeleteFunc: changed,
	})
	return err
}

func (h *Hub) remove(id string, uid types.UID) {
	h.engine.Forget(uid)
	h.drop(id)
}

// drop takes id out of every prober's share.
func (h *Hub) drop(id string) {
	h.mu.Lock()
	if _, ok := h.targets[id]; ok {
		delete(h.targets, id)
		h.dirty[id] = struct{}{}
		h.trigger()
	}
	h.mu.Unlock()
}

// denied says why a proxy at ip, checked with url, must not be probed, or
// "". Names are let through here: the prober checks what they resolve to.
func (h *Hub) denied(ip, rawURL string) string {
	if p, ok := h.opts.Deny.DeniesHost(ip); ok {
		return fmt.Sprintf("the proxy's address %s is in --probe-deny-cidrs (%s); it is never probed", ip, p)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return ""
	}
	if err := h.opts.Egress.CheckHost(netpolicy.Destination(u)); err != nil {
		return fmt.Sprintf("the health-check URL %s is outside the egress policy (%s); it is never probed", u.Host, err)
	}
	return ""
}

// Start serves the probe endpoint until ctx ends (a manager Runnable).
func (h *Hub) Start(ctx context.Context) error {
	ln := h.listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", h.opts.Addr); err != nil {
			return fmt.Errorf("--probe-addr %s: %w", h.opts.Addr, err)
		}
	}
	opts := []grpc.ServerOption{
		grpc.StatsHandler(otelgrpc.NewServerHandler()),
		grpc.ChainStreamInterceptor(grpcMetrics.StreamServerInterceptor(), auth.StreamInterceptor(h.opts.Token)),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	}
	if h.opts.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(h.opts.TLS)))
	}
	srv := grpc.NewServer(opts...)
	probev1.RegisterProbeServiceServer(srv, h)
	go h.rebalancer(ctx)
	go h.engine.Run(ctx)
	go func() { <-ctx.Done(); srv.Stop() }()
	h.log.Info("serving the probe endpoint", "addr", ln.Addr().String())
	if err := srv.Serve(ln); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

// Listen binds the endpoint early, so a bad address fails start-up and
// tests learn the port.
func (h *Hub) Listen() (string, error) {
	ln, err := net.Listen("tcp", h.opts.Addr)
	if err != nil {
		return "", fmt.Errorf("--probe-addr %s: %w", h.opts.Addr, err)
	}
	h.listener = ln
	return ln.Addr().String(), nil
}
