package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
)

// finding is one check's result: what was checked, whether it holds,
// what was seen, and, when it does not hold, how to fix it.
type finding struct {
	Check  string `json:"check"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

func (e *env) checkCmd() *cobra.Command {
	var f checkFlags
	cmd := &cobra.Command{
		Use:   "check <url> --pool <pool> | check install",
		Short: "Fetch a URL through a pool's healthy exits and judge each answer; or check the install",
		Long: `check <url> leases every healthy member of --pool (or --count of them),
those cooling down for the URL's host included, fetches the URL through
each from this machine (so their addresses must be reachable from here),
prints each exit's status, latency and the default ban policy's verdict,
and releases the leases. Nothing is reported unless --report is given.
Exit code 2 when an exit did not fetch cleanly.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return e.checkURL(cmd.Context(), args[0], f) },
	}
	cmd.Flags().StringVar(&f.pool, "pool", "", "the ProxyPool (in -n) whose members fetch the URL")
	cmd.Flags().IntVar(&f.count, "count", 0, "at most this many members (0: every healthy one)")
	cmd.Flags().BoolVar(&f.report, "report", false, "report each verdict to the brokers, as a crawler would")
	cmd.Flags().StringVar(&f.caFile, "target-ca-file", "", "a CA the URL's certificate is checked against, beside the system's")
	cmd.Flags().DurationVar(&f.fetchTimeout, "fetch-timeout", 20*time.Second, "how long one fetch may take")
	e.outputFlag(cmd)
	install := &cobra.Command{
		Use:   "install",
		Short: "CRDs, the controller leading, probers and brokers up, the lease API reachable with its TLS and token, the gateway's exposure",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fs := e.checkInstall(cmd.Context())
			err := e.emit(map[string]any{"checks": fs}, func(w io.Writer) {
				row(w, "CHECK", "", "DETAIL", "FIX")
				for _, f := range fs {
					mark := "ok"
					if !f.OK {
						mark = "FAIL"
					}
					row(w, f.Check, mark, f.Detail, dash(f.Fix))
				}
			})
			if err != nil {
				return err
			}
			failed := 0
			for _, f := range fs {
				if !f.OK {
					failed++
				}
			}
			if failed > 0 {
				return &exitError{code: 2, msg: fmt.Sprintf("%d of %d checks failed", failed, len(fs))}
			}
			return nil
		},
	}
	cmd.AddCommand(e.outputFlag(install))
	return cmd
}

// crds are the install's resources.
var crds = []string{"proxies", "proxypools", "proxysources", "targetpolicies", "tenants"}

func (e *env) checkInstall(ctx context.Context) []finding {
	var out []finding
	add := func(check string, err error, detail, fix string) {
		f := finding{Check: check, OK: err == nil, Detail: detail}
		if err != nil {
			f.Detail, f.Fix = err.Error(), fix
		}
		out = append(out, f)
	}
	for _, name := range crds {
		var crd apiextensionsv1.CustomResourceDefinition
		err := e.kube.Get(ctx, client.ObjectKey{Name: name + ".crawl.example.com"}, &crd)
		if err == nil && !established(&crd) {
			err = fmt.Errorf("CRD %s is not Established", crd.Name)
		}
		add("crd "+name, err, "Established, served versions "+served(&crd),
			"helm upgrade the release (its hook applies the CRDs), or make install")
	}
	deployments := map[string]*appsv1.Deployment{}
	for _, c := range []string{"controller", "prober", "broker"} {
		var d appsv1.Deployment
		name := e.release + "-" + c
		err := e.kube.Get(ctx, client.ObjectKey{Namespace: e.releaseNS, Name: name}, &d)
		if err == nil {
			deployments[c] = &d
			if d.Status.AvailableReplicas < 1 {
				err = fmt.Errorf("deployment %s has no available replica (%d of %d ready)", name, d.Status.ReadyReplicas, ptrOr(d.Spec.Replicas))
			}
		}
		add(c+"s up", err, fmt.Sprintf("%d of %d available", d.Status.AvailableReplicas, ptrOr(d.Spec.Replicas)),
			fmt.Sprintf("kubectl -n %s describe deployment %s; kubectl -n %s logs deployment/%s", e.releaseNS, name, e.releaseNS, name))
	}
	add("controller leading", e.leading(ctx, deployments["controller"]), "a replica holds and renews the leader Lease",
		fmt.Sprintf("kubectl -n %s logs deployment/%s-controller (leader election needs its RBAC on leases)", e.releaseNS, e.release))
	api, done, err := e.leaseAPI(ctx)
	if err != nil {
		add("lease API reachable", err, "", "check --release, --release-namespace, the brokers' pods, and with TLS the CA (--ca-file)")
	} else {
		defer done()
		resp, err := api.ListProxies(ctx, &leasev1.ListProxiesRequest{PageSize: 500})
		detail := ""
		if err == nil {
			ns := map[string]bool{}
			for _, p := range resp.GetProxies() {
				ns[strings.SplitN(p.GetId(), "/", 2)[0]] = true
			}
			more := ""
			if resp.GetNextPageToken() != "" {
				more = " (first page)"
			}
			detail = fmt.Sprintf("ListProxies answered: %d proxies in namespaces %s%s", len(resp.GetProxies()), strings.Join(sortedKeys(ns), ","), more)
		}
		add("lease API and token", err, detail, "the token's tenant may lack the list verb or these namespaces: kubectl get tenants -n "+e.releaseNS)
	}
	if d := deployments["broker"]; d != nil {
		add("gateway exposure", e.gateway(ctx, d), "not served, or served inside the cluster or over TLS",
			"set broker.gateway.tls.enabled with broker.tls, or keep broker.gateway.service.type ClusterIP")
	}
	return out
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established {
			return c.Status == apiextensionsv1.ConditionTrue
		}
	}
	return false
}

func served(crd *apiextensionsv1.CustomResourceDefinition) string {
	var vs []string
	for _, v := range crd.Spec.Versions {
		if v.Served {
			vs = append(vs, v.Name)
		}
	}
	return strings.Join(vs, ",")
}

func ptrOr(p *int32) int32 {
	if p == nil {
		return 1
	}
	return *p
}

// leading checks the controller's leader Lease (its --leader-election-id)
// is held and renewed.
func (e *env) leading(ctx context.Context, d *appsv1.Deployment) error {
	id := e.release + "-controller"
	if d != nil {
		for _, c := range d.Spec.Template.Spec.Containers {
			for _, a := range c.Args {
				if v, ok := strings.CutPrefix(a, "--leader-election-id="); ok {
					id = v
				}
			}
		}
	}
	var l coordinationv1.Lease
	key := client.ObjectKey{Namespace: e.releaseNS, Name: id}
	if err := e.kube.Get(ctx, key, &l); err != nil {
		return fmt.Errorf("reading the leader Lease %s: %w", key, err)
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || l.Spec.RenewTime == nil {
		return fmt.Errorf("no replica holds the leader Lease %s", key)
	}
	lease := 15 * time.Second
	if l.Spec.LeaseDurationSeconds != nil {
		lease = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	if age := time.Since(l.Spec.RenewTime.Time); age > 2*lease {
		return fmt.Errorf("the leader Lease %s was last renewed %s ago by %s, past twice its %s duration", key, age.Round(time.Second), *l.Spec.HolderIdentity, lease)
	}
	return nil
}

// gateway checks the gateway is not served in the clear outside the
// cluster.
func (e *env) gateway(ctx context.Context, d *appsv1.Deployment) error {
	on, tls := false, false
	for _, c := range d.Spec.Template.Spec.Containers {
		on = on || slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--gateway-addr") })
		tls = tls || slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--gateway-tls-addr") })
	}
	if !on {
		return nil
	}
	var svc corev1.Service
	if err := e.kube.Get(ctx, client.ObjectKey{Namespace: e.releaseNS, Name: e.release + "-gateway"}, &svc); err != nil {
		return fmt.Errorf("the gateway is served but its Service %s-gateway cannot be read: %w", e.release, err)
	}
	if svc.Spec.Type != corev1.ServiceTypeClusterIP && !tls {
		return fmt.Errorf("the gateway's Service is %s without TLS: its passwords (tokens) cross the network in the clear", svc.Spec.Type)
	}
	return nil
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
