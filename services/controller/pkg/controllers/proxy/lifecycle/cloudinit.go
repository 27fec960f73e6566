package lifecycle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/kube"
)

// cloudInitError: the Secret cannot be used as written; only a change to
// it (or to the Proxy) helps, and both come back as watch events.
type cloudInitError struct{ msg string }

func (e *cloudInitError) Error() string { return e.msg }

// resolveCloudInit returns the user-data bytes. Secrets come from the
// manager's cache, which holds only Secrets labelled
// crawl.example.com/cloud-init=true: an unlabelled Secret is invisible by
// design, and the message says so.
func (r *Reconciler) resolveCloudInit(ctx context.Context, px *v1.Proxy) ([]byte, error) {
	ci := px.Spec.CloudInit
	switch {
	case ci == nil:
		return nil, nil
	case ci.SecretRef == nil:
		return []byte(ci.Inline), nil
	}
	ref := ci.SecretRef
	key := ref.Key
	if key == "" {
		key = "user-data"
	}
	if err := kube.CheckSecretNamespace(r.opts.SecretNamespaces, px.Namespace, ref.Name); err != nil {
		return nil, &cloudInitError{"cloud-init " + err.Error()}
	}
	sec := &corev1.Secret{}
	if err := r.client.Get(ctx, client.ObjectKey{Namespace: px.Namespace, Name: ref.Name}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &cloudInitError{fmt.Sprintf("cloud-init Secret %s/%s not found, or not labelled %s=\"true\" (the controller sees only labelled Secrets)", px.Namespace, ref.Name, v1.LabelCloudInit)}
		}
		return nil, fmt.Errorf("reading cloud-init Secret %s/%s: %w", px.Namespace, ref.Name, err)
	}
	data, ok := sec.Data[key]
	if !ok {
		return nil, &cloudInitError{fmt.Sprintf("cloud-init Secret %s/%s has no key %q", px.Namespace, ref.Name, key)}
	}
	return data, nil
}

// SpecHash hashes what an instance is built from: placement, the resolved
// cloud-init content (so rotating a Secret replaces the instance) and the
// port. Attributes and health-check settings are deliberately left out:
// changing them never replaces an instance.
func SpecHash(spec v1.ProxySpec, cloudInit []byte) string {
	ciSum := sha256.Sum256(cloudInit)
	b, _ := json.Marshal(struct {
		Placement *v1.Placement `json:"placement"`
		CloudInit string        `json:"cloudInit"`
		Port      int32         `json:"port"`
	}{spec.Placement, hex.EncodeToString(ciSum[:]), spec.Port})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// CacheByObject is the cache configuration the reconciler relies on: the
// only Secrets it can see are those labelled crawl.example.com/cloud-init
// in namespaces (all when empty), which is least privilege in the cache
// and not only in RBAC.
func CacheByObject(namespaces []string) map[client.Object]cache.ByObject {
	return kube.SecretsLabelled(v1.LabelCloudInit, namespaces)
}
