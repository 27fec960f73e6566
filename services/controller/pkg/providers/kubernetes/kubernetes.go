// Package kubernetes is the provider whose instances are Squid pods in the
// cluster the controller runs in. It needs no cloud account (local
// development, CI, the kind quickstart); its pods share the cluster's
// egress IP, so it exercises the whole lifecycle but not distinct egress
// paths.
package kubernetes

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
	"github.com/egress-proxies/egress-proxies/pkg/squidconf"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
)

// Type is the providers-config type name.
const Type = "kubernetes"

// DefaultImage is the Squid image a pod runs when placement.image is empty.
const DefaultImage = "ubuntu/squid:6.6-24.04_edge"

// Config is the `kubernetes:` block of a providers-config entry.
type Config struct {
	// Namespace the pods run in; default: the controller's namespace.
	Namespace string `json:"namespace,omitempty"`
	// Image of the Squid container; placement.image overrides it per Proxy.
	Image string `json:"image,omitempty"`
	// AllowedImages are the other images placement.image may name. The
	// pods run in the controller's namespace with its network reach, and
	// anyone who may create a Proxy in any namespace names the image, so
	// only images the operator listed here (or Image) run.
	AllowedImages []string `json:"allowedImages,omitempty"`
}

// Provider creates one pod per instance.
type Provider struct {
	entry     string
	cfg       Config
	egress    netpolicy.Egress
	client    client.Client
	apiReader client.Reader
}

var _ providers.Provider = (*Provider)(nil)

// New is the Factory of this type.
func New(_ context.Context, e providers.Entry, deps providers.Deps) (providers.Provider, error) {
	var cfg Config
	if err := e.DecodeBlock(&cfg); err != nil {
		return nil, err
	}
	if cfg.Namespace == "" {
		cfg.Namespace = deps.Namespace
	}
	if cfg.Namespace == "" {
		return nil, fmt.Errorf("provider %s: kubernetes.namespace is required when the controller's namespace is unknown", e.Name)
	}
	if cfg.Image == "" {
		cfg.Image = DefaultImage
	}
	return &Provider{entry: e.Name, cfg: cfg, egress: deps.Egress, client: deps.Client, apiReader: deps.APIReader}, nil
}

const idPrefix = "kubernetes://"

// ProviderID is "kubernetes://<namespace>/<pod name>".
func ProviderID(namespace, name string) string { return idPrefix + namespace + "/" + name }

func parseID(id string) (client.ObjectKey, error) {
	rest, ok := strings.CutPrefix(id, idPrefix)
	ns, name, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || ns == "" || name == "" {
		return client.ObjectKey{}, providers.NewInvalidConfig("providerID %q is not kubernetes://<namespace>/<name>", id)
	}
	return client.ObjectKey{Namespace: ns, Name: name}, nil
}

// Create creates the pod; an existing pod of ours with that name is returned.
func (p *Provider) Create(ctx context.Context, req *providers.CreateRequest) (*providers.Instance, error) {
	if img := req.Placement.Image; img != "" && img != p.cfg.Image && !slices.Contains(p.cfg.AllowedImages, img) {
		return nil, providers.NewInvalidConfig("placement.image %q is not allowed by provider entry %s: it runs %s, or an image listed in its kubernetes.allowedImages", img, p.entry, p.cfg.Image)
	}
	pod := p.pod(req)
	err := p.client.Create(ctx, pod)
	switch {
	case err == nil:
		return p.instance(pod), p.configSecret(ctx, pod, req)
	case apierrors.IsAlreadyExists(err):
		existing := &corev1.Pod{}
		if err := p.apiReader.Get(ctx, client.ObjectKeyFromObject(pod), existing); err != nil {
			return nil, fmt.Errorf("reading existing pod %s: %w", pod.Name, err)
		}
		if existing.Labels[providers.TagOwnerUID] != string(req.Owner.UID) {
			return nil, providers.NewInvalidConfig("pod %s/%s exists and belongs to another owner (uid %q)", existing.Namespace, existing.Name, existing.Labels[providers.TagOwnerUID])
		}
		// A create that died between the pod and its Secret: the pod
		// waits for the Secret, which this retry makes.
		return p.instance(existing), p.configSecret(ctx, existing, req)
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota"):
		return nil, providers.NewQuota(err)
	case apierrors.IsInvalid(err):
		return nil, providers.NewInvalidConfig("pod for %s is invalid: %v", req.Name, err)
	default:
		return nil, err
	}
}

// configSecretName is the Secret holding a pod's Squid config.
func configSecretName(pod string) string { return pod + "-squid" }

// configSecret stores what the pod's Squid runs, owned by the pod, so the
// API server's garbage collector removes it with the pod: squidconf's
// whole config (the egress policy ahead of any allow) and, when the proxy
// asks for credentials, them (read back by whoever needs them) and
// proxyauth's helper admitting them. A Secret, not a ConfigMap: it holds
// credentials. The pod is made first (an owner needs a UID); until this
// Secret exists its container waits to start.
func (p *Provider) configSecret(ctx context.Context, pod *corev1.Pod, req *providers.CreateRequest) error {
	conf := squidconf.Config{Listen: fmt.Sprint(req.Port), Egress: p.egress, ShutdownLifetime: squidShutdown}
	data := map[string][]byte{}
	if !req.Credentials.Empty() {
		conf.AuthHelper = configDir + "/" + authHelperKey
		data[proxyauth.KeyUsername] = []byte(req.Credentials.Username)
		data[proxyauth.KeyPassword] = []byte(req.Credentials.Password)
		data[authHelperKey] = []byte(req.Credentials.SquidHelper())
	}
	data[confKey] = []byte(conf.String())
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: configSecretName(pod.Name), Namespace: pod.Namespace, Labels: providers.OwnerTags(p.entry, req.Owner),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}},
		},
		Data: data,
	}
	if err := p.client.Create(ctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the Squid config Secret of pod %s: %w", pod.Name, err)
	}
	return nil
}

// squidShutdown bounds a Squid pod's exit (Squid waits 30 s for clients
// by default); an instance is deleted after its drain, or with its Proxy,
// which no broker leases any longer, so a few seconds let in-flight
// requests end without holding a pool's scale-down for half a minute per
// member. The pod's grace period leaves it room.
const (
	squidShutdown  = 5 * time.Second
	podGracePeriod = 15
)

// Where the pod mounts its config Secret, and the Secret's files.
const (
	configDir     = "/etc/squid/egress"
	authHelperKey = "auth.sh"
	confKey       = "squid.conf"
)

// squidUID is the proxy user of Debian's and Ubuntu's squid packages (and
// of ubuntu/squid): the pod runs Squid as it from the start, never root.
const squidUID = 13

func (p *Provider) pod(req *providers.CreateRequest) *corev1.Pod {
	image := p.cfg.Image
	if req.Placement.Image != "" {
		image = req.Placement.Image
	}
	nodeSelector := map[string]string{}
	if req.Placement.Zone != "" {
		nodeSelector[corev1.LabelTopologyZone] = req.Placement.Zone
	}
	if req.Placement.MachineType != "" {
		nodeSelector[corev1.LabelInstanceTypeStable] = req.Placement.MachineType
	}
	port := intstr.FromInt32(req.Port)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        req.Name,
			Namespace:   p.cfg.Namespace,
			Labels:      providers.OwnerTags(p.entry, req.Owner),
			Annotations: map[string]string{providers.TagOwner: req.Owner.Key()},
		},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](podGracePeriod),
			Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{
				Secret: &corev1.SecretVolumeSource{SecretName: configSecretName(req.Name)}}}},
			NodeSelector: nodeSelector,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](squidUID), RunAsGroup: ptr.To[int64](squidUID),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:  "squid",
				Image: image,
				// The whole config is the Secret's; -d 1 logs to the
				// container's stderr, the only thing Squid writes.
				Command: []string{"/usr/sbin/squid", "-NYC", "-d", "1", "-f", configDir + "/" + confKey},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: configDir, ReadOnly: true}},
				Ports:        []corev1.ContainerPort{{Name: "proxy", ContainerPort: req.Port, Protocol: corev1.ProtocolTCP}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: port}},
				},
			}},
		},
	}
}

func (p *Provider) instance(pod *corev1.Pod) *providers.Instance {
	owner, _ := providers.OwnerFromTags(pod.Labels, "", "")
	owner.Namespace, owner.Name, _ = strings.Cut(pod.Annotations[providers.TagOwner], "/")
	inst := &providers.Instance{
		ProviderID: ProviderID(pod.Namespace, pod.Name),
		Name:       pod.Name,
		IP:         pod.Status.PodIP,
		CreatedAt:  pod.CreationTimestamp.Time,
		Owner:      owner,
		State:      providers.StatePending,
	}
	switch {
	case pod.DeletionTimestamp != nil:
		inst.State = providers.StateTerminating
	case pod.Status.Phase == corev1.PodRunning && pod.Status.PodIP != "":
		inst.State = providers.StateRunning
	case pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
		inst.State = providers.StateFailed
	}
	return inst
}

// Get reads the pod from the API server, not a cache.
func (p *Provider) Get(ctx context.Context, id string) (*providers.Instance, error) {
	key, err := parseID(id)
	if err != nil {
		return nil, err
	}
	pod := &corev1.Pod{}
	if err := p.apiReader.Get(ctx, key, pod); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, providers.NewNotFound("pod %s", key)
		}
		return nil, err
	}
	return p.instance(pod), nil
}

// Delete deletes the pod; a missing pod is not an error.
func (p *Provider) Delete(ctx context.Context, id string) error {
	key, err := parseID(id)
	if err != nil {
		return err
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	return client.IgnoreNotFound(p.client.Delete(ctx, pod))
}

// List returns the pods this entry created.
func (p *Provider) List(ctx context.Context) ([]*providers.Instance, error) {
	pods := &corev1.PodList{}
	if err := p.apiReader.List(ctx, pods, client.InNamespace(p.cfg.Namespace), client.MatchingLabels{
		providers.TagManagedBy: providers.ManagedByValue,
		providers.TagProvider:  p.entry,
	}); err != nil {
		return nil, err
	}
	out := make([]*providers.Instance, 0, len(pods.Items))
	for i := range pods.Items {
		if pods.Items[i].Labels[providers.TagOwnerUID] == "" {
			continue
		}
		out = append(out, p.instance(&pods.Items[i]))
	}
	return out, nil
}
