// Package crds applies the project's CustomResourceDefinitions: the
// chart's pre-install and pre-upgrade hook runs the controller's image
// with --apply-crds on a directory of them (a ConfigMap made from the
// chart's files/crds).
//
// Helm owns what a release renders, and refuses to install over objects
// another release owns: CRDs rendered as templates and kept on uninstall
// still name the removed release, so installing again in another
// namespace failed. Applied by a hook, the CRDs belong to no release:
// every install and upgrade applies the chart's schema, an uninstall
// leaves them (and every Proxy) in place, and any later install takes
// them up.
package crds

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// FieldOwner is the server-side apply manager of every field the hook
// sets; it takes fields over from an earlier owner (Helm, when the CRDs
// were chart templates).
const FieldOwner = "egress-proxies-crds"

// Load reads every .yaml file of dir as one CRD; anything else is an
// error naming the file.
func Load(dir string) ([]*unstructured.Unstructured, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("--apply-crds: no .yaml file in %s", dir)
	}
	sort.Strings(files)
	var out []*unstructured.Unstructured
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(b, &u.Object); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		if u.GetAPIVersion() != apiextensionsv1.SchemeGroupVersion.String() || u.GetKind() != "CustomResourceDefinition" {
			return nil, fmt.Errorf("%s holds a %s %s, not an %s CustomResourceDefinition", f, u.GetAPIVersion(), u.GetKind(), apiextensionsv1.SchemeGroupVersion)
		}
		out = append(out, u)
	}
	return out, nil
}

// Apply applies each CRD server-side and waits until every one is
// Established, so whatever the release starts next can use it.
func Apply(ctx context.Context, c client.Client, log *slog.Logger, crds []*unstructured.Unstructured) error {
	for _, u := range crds {
		u = u.DeepCopy()
		u.SetResourceVersion("")
		unstructured.RemoveNestedField(u.Object, "status")
		if err := c.Patch(ctx, u, client.Apply, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
			return fmt.Errorf("applying CRD %s: %w", u.GetName(), err)
		}
		log.Info("applied", "crd", u.GetName())
	}
	for _, u := range crds {
		if err := established(ctx, c, u.GetName()); err != nil {
			return err
		}
	}
	return nil
}

func established(ctx context.Context, c client.Client, name string) error {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
			last = err.Error()
		} else {
			var why []string
			for _, cond := range crd.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return nil
				}
				if cond.Status != apiextensionsv1.ConditionTrue && cond.Message != "" {
					why = append(why, fmt.Sprintf("%s: %s", cond.Type, cond.Message))
				}
			}
			last = "not Established yet " + strings.Join(why, "; ")
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRD %s: %s: %w", name, last, ctx.Err())
		case <-tick.C:
		}
	}
}
