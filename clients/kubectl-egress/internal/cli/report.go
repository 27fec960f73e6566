package cli

import (
	"archive/zip"
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/sanitize"
)

// secretish finds what must not leave in a report even where a log or a
// field held it by mistake: bearer tokens, Basic credentials, and
// password, token or key assignments.
var secretish = regexp.MustCompile(`(?i)(bearer\s+|basic\s+|(password|passwd|token|secret|apikey|api_key)["']?\s*[:=]\s*["']?)[^\s"',;&]+`)

// redactor scrubs what a report writes.
type redactor struct{ known []string }

func (r redactor) scrub(b []byte) []byte {
	s := string(b)
	for _, k := range r.known {
		if len(k) >= 8 {
			s = strings.ReplaceAll(s, k, "[REDACTED]")
		}
	}
	return []byte(secretish.ReplaceAllString(sanitize.Userinfo(s), "${1}[REDACTED]"))
}

// redactCloudInit replaces every inline cloud-init in v (a Proxy's, a
// ProxyPool template's, any to come) by walking v as JSON: user-data
// holds SSH keys, htpasswd lines and passwords no regular expression
// can tell from the rest of it.
func redactCloudInit(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var tree any
	if err := json.Unmarshal(b, &tree); err != nil {
		return nil, err
	}
	var walk func(any)
	walk = func(n any) {
		switch n := n.(type) {
		case map[string]any:
			for k, c := range n {
				if ci, ok := c.(map[string]any); ok && k == "cloudInit" {
					if _, inline := ci["inline"]; inline {
						ci["inline"] = "[REDACTED]"
					}
				}
				walk(c)
			}
		case []any:
			for _, c := range n {
				walk(c)
			}
		}
	}
	walk(tree)
	return tree, nil
}

func (e *env) reportCmd() *cobra.Command {
	var file string
	var logLines int64
	cmd := &cobra.Command{
		Use:   "report",
		Short: "A zip of what a bug report needs: status, check install, the project's objects, events and logs; Secrets never read, credentials redacted",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				file = "egress-proxies-report-" + time.Now().UTC().Format("20060102-150405") + ".zip"
			}
			if err := e.report(cmd.Context(), file, logLines); err != nil {
				return err
			}
			fmt.Fprintf(e.out, "wrote %s: read it before you share it\n", file)
			return nil
		},
	}
	cmd.Flags().StringVar(&file, "output-file", "", "where to write the zip (default: egress-proxies-report-<time>.zip)")
	cmd.Flags().Int64Var(&logLines, "log-lines", 2000, "the last lines of each container's log")
	return cmd
}

// report writes the zip. What it cannot read (RBAC, the brokers down)
// becomes a line in errors.txt, so a report comes out of a broken
// install too.
func (e *env) report(ctx context.Context, file string, logLines int64) error {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	z := zip.NewWriter(f)
	red := redactor{known: []string{e.token}}
	var problems []string
	put := func(name string, b []byte) {
		w, err := z.Create(name)
		if err == nil {
			_, err = w.Write(red.scrub(b))
		}
		if err != nil {
			problems = append(problems, name+": "+err.Error())
		}
	}
	putYAML := func(name string, v any) {
		v, err := redactCloudInit(v)
		if err != nil {
			problems = append(problems, name+": "+err.Error())
			return
		}
		b, err := yaml.Marshal(v)
		if err != nil {
			problems = append(problems, name+": "+err.Error())
			return
		}
		put(name, b)
	}
	note := func(what string, err error) {
		if err != nil {
			problems = append(problems, what+": "+err.Error())
		}
	}

	cs, err := kubernetes.NewForConfig(e.restConfig)
	if err != nil {
		return err
	}
	version := "kubectl-egress (this build)\n"
	if v, err := cs.Discovery().ServerVersion(); err == nil {
		version += "server " + v.GitVersion + "\n"
	} else {
		note("server version", err)
	}
	put("version.txt", []byte(version))

	// What the plugin's own reads say.
	if fl, err := e.readFleet(ctx); err == nil {
		b, _ := json.MarshalIndent(fl.view(time.Now()), "", "  ")
		put("status.json", b)
	} else {
		note("status", err)
	}
	b, _ := json.MarshalIndent(e.checkInstall(ctx), "", "  ")
	put("check-install.json", b)

	// The project's objects, without managedFields; putYAML redacts every
	// inline cloud-init.
	lists := map[string]client.ObjectList{
		"proxies": &v1.ProxyList{}, "proxypools": &v1.ProxyPoolList{}, "proxysources": &v1.ProxySourceList{}, "targetpolicies": &v1.TargetPolicyList{}, "tenants": &v1.TenantList{},
	}
	for name, l := range lists {
		if err := e.kube.List(ctx, l, client.InNamespace(e.scope())); err != nil {
			note(name, err)
			continue
		}
		putYAML("objects/"+name+".yaml", stripManaged(l))
	}
	release := map[string]client.ObjectList{
		"deployments": &appsv1.DeploymentList{}, "statefulsets": &appsv1.StatefulSetList{}, "pods": &corev1.PodList{},
		"services": &corev1.ServiceList{}, "networkpolicies": &networkingv1.NetworkPolicyList{}, "events": &corev1.EventList{},
	}
	for name, l := range release {
		if err := e.kube.List(ctx, l, client.InNamespace(e.releaseNS)); err != nil {
			note(e.releaseNS+" "+name, err)
			continue
		}
		putYAML("release/"+name+".yaml", stripManaged(l))
	}
	// ConfigMaps by name and keys only: their values are the operator's.
	var cms corev1.ConfigMapList
	if err := e.kube.List(ctx, &cms, client.InNamespace(e.releaseNS)); err == nil {
		var sb strings.Builder
		for _, cm := range cms.Items {
			keys := make([]string, 0, len(cm.Data))
			for k := range cm.Data {
				keys = append(keys, k)
			}
			fmt.Fprintf(&sb, "%s: %s\n", cm.Name, strings.Join(keys, ", "))
		}
		put("release/configmaps.txt", []byte(sb.String()))
	} else {
		note("configmaps", err)
	}
	var evs corev1.EventList
	if err := e.kube.List(ctx, &evs, client.InNamespace(e.scope())); err == nil {
		putYAML("objects/events.yaml", stripManaged(&evs))
	} else {
		note("events", err)
	}
	e.putLogs(ctx, cs, logLines, put, note)
	if len(problems) > 0 {
		put("errors.txt", []byte(strings.Join(problems, "\n")+"\n"))
	}
	if err := z.Close(); err != nil {
		return err
	}
	return f.Close()
}

// putLogs adds the last lines of every container of the release's pods.
func (e *env) putLogs(ctx context.Context, cs kubernetes.Interface, lines int64, put func(string, []byte), note func(string, error)) {
	var pods corev1.PodList
	if err := e.kube.List(ctx, &pods, client.InNamespace(e.releaseNS)); err != nil {
		note("logs", err)
		return
	}
	for _, p := range pods.Items {
		for _, c := range p.Spec.Containers {
			rc, err := cs.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: c.Name, TailLines: &lines}).Stream(ctx)
			if err != nil {
				note("logs of "+p.Name+"/"+c.Name, err)
				continue
			}
			var sb strings.Builder
			sc := bufio.NewScanner(io.LimitReader(rc, 64<<20))
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				sb.WriteString(sc.Text())
				sb.WriteByte('\n')
			}
			_ = rc.Close()
			put("logs/"+p.Name+"/"+c.Name+".log", []byte(sb.String()))
		}
	}
}

// stripManaged drops managedFields and last-applied annotations: noise
// that can repeat a whole object, secrets included.
func stripManaged(l client.ObjectList) client.ObjectList {
	items, _ := metaItems(l)
	for _, o := range items {
		o.SetManagedFields(nil)
		a := o.GetAnnotations()
		delete(a, "kubectl.kubernetes.io/last-applied-configuration")
		o.SetAnnotations(a)
	}
	return l
}

func metaItems(l client.ObjectList) ([]client.Object, error) {
	objs, err := apimeta.ExtractList(l)
	if err != nil {
		return nil, err
	}
	out := make([]client.Object, 0, len(objs))
	for _, o := range objs {
		if co, ok := o.(client.Object); ok {
			out = append(out, co)
		}
	}
	return out, nil
}
