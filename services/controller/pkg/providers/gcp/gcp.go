// Package gcp is the provider whose instances are Compute Engine VMs with
// an ephemeral external IP: the real egress fleet. It makes exactly four
// API calls (Insert, Get, Delete, AggregatedList), all fire-and-forget:
// Create returns once Insert is accepted and the reconciler polls Get.
package gcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"golang.org/x/oauth2/google"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
)

// Type is the providers-config type name.
const Type = "gcp"

// Config is the `gcp:` block of a providers-config entry.
type Config struct {
	// Project the VMs are created in. Required.
	Project string `json:"project"`
	// Network of the VM's one NIC; default "global/networks/default".
	Network string `json:"network,omitempty"`
	// NetworkTag lets a firewall rule admit proxy traffic; default "egress-proxy".
	NetworkTag string `json:"networkTag,omitempty"`
	// DiskSizeGb of the boot disk; default 10.
	DiskSizeGb int64 `json:"diskSizeGb,omitempty"`
	// Endpoint overrides the Compute API endpoint (Private Service Connect,
	// or a local emulator); default the public API.
	Endpoint string `json:"endpoint,omitempty"`
	// WithoutAuthentication sends no credentials: only for an emulator.
	WithoutAuthentication bool `json:"withoutAuthentication,omitempty"`
}

// Label keys on our VMs. GCP label keys allow [a-z0-9_-] only, so the
// contract's tags are mapped; the owner's namespace/name (which may hold
// '.' or exceed 63 characters) goes into instance metadata instead.
const (
	labelManagedBy  = "managed-by"
	labelProvider   = "egress-proxies-provider"
	labelOwnerUID   = "egress-proxies-owner-uid"
	labelGeneration = "egress-proxies-generation"
	metadataOwner   = "egress-proxies-owner"
	metadataUser    = "user-data"
)

// Provider talks to Compute Engine.
type Provider struct {
	entry string
	cfg   Config
	c     *compute.InstancesClient
}

var _ providers.Provider = (*Provider)(nil)

// New is the Factory of this type. Missing Application Default
// Credentials make the entry unavailable, not the manager fail.
func New(ctx context.Context, e providers.Entry, _ providers.Deps) (providers.Provider, error) {
	var cfg Config
	if err := e.DecodeBlock(&cfg); err != nil {
		return nil, err
	}
	if cfg.Project == "" {
		return nil, fmt.Errorf("provider %s: gcp.project is required", e.Name)
	}
	if cfg.Network == "" {
		cfg.Network = "global/networks/default"
	}
	if cfg.NetworkTag == "" {
		cfg.NetworkTag = "egress-proxy"
	}
	if cfg.DiskSizeGb == 0 {
		cfg.DiskSizeGb = 10
	}
	var opts []option.ClientOption
	if cfg.Endpoint != "" {
		opts = append(opts, option.WithEndpoint(cfg.Endpoint))
	}
	if cfg.WithoutAuthentication {
		opts = append(opts, option.WithoutAuthentication(), option.WithHTTPClient(http.DefaultClient))
	} else if _, err := google.FindDefaultCredentials(ctx, compute.DefaultAuthScopes()...); err != nil {
		return nil, &providers.UnavailableError{Entry: e.Name, Err: fmt.Errorf("no Application Default Credentials (workload identity in-cluster, `gcloud auth application-default login` locally): %w", err)}
	}
	c, err := compute.NewInstancesRESTClient(ctx, opts...)
	if err != nil {
		return nil, &providers.UnavailableError{Entry: e.Name, Err: err}
	}
	return &Provider{entry: e.Name, cfg: cfg, c: c}, nil
}

// ProviderID is "gcp://<project>/<zone>/<name>".
func ProviderID(project, zone, name string) string {
	return "gcp://" + project + "/" + zone + "/" + name
}

func parseID(id string) (project, zone, name string, err error) {
	rest, ok := strings.CutPrefix(id, "gcp://")
	parts := strings.Split(rest, "/")
	if !ok || len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return "", "", "", providers.NewInvalidConfig("providerID %q is not gcp://<project>/<zone>/<name>", id)
	}
	return parts[0], parts[1], parts[2], nil
}

func (p *Provider) validate(req *providers.CreateRequest) error {
	for _, f := range []struct{ name, v string }{
		{"zone", req.Placement.Zone}, {"machineType", req.Placement.MachineType}, {"image", req.Placement.Image},
	} {
		if f.v == "" {
			return providers.NewInvalidConfig("spec.placement.%s is required by the gcp provider %q", f.name, p.entry)
		}
	}
	return nil
}

// instanceResource is exactly what Insert sends.
func (p *Provider) instanceResource(req *providers.CreateRequest) *computepb.Instance {
	mt := req.Placement.MachineType
	if !strings.Contains(mt, "/") {
		mt = "zones/" + req.Placement.Zone + "/machineTypes/" + mt
	}
	meta := []*computepb.Items{{Key: ptr.To(metadataOwner), Value: ptr.To(req.Owner.Key())}}
	if len(req.CloudInit) > 0 {
		meta = append(meta, &computepb.Items{Key: ptr.To(metadataUser), Value: ptr.To(string(req.CloudInit))})
	}
	return &computepb.Instance{
		Name:        ptr.To(req.Name),
		MachineType: ptr.To(mt),
		Disks: []*computepb.AttachedDisk{{
			Boot: ptr.To(true), AutoDelete: ptr.To(true), Type: ptr.To("PERSISTENT"),
			InitializeParams: &computepb.AttachedDiskInitializeParams{SourceImage: ptr.To(req.Placement.Image), DiskSizeGb: ptr.To(p.cfg.DiskSizeGb)},
		}},
		NetworkInterfaces: []*computepb.NetworkInterface{{
			Network:       ptr.To(p.cfg.Network),
			AccessConfigs: []*computepb.AccessConfig{{Name: ptr.To("External NAT"), Type: ptr.To("ONE_TO_ONE_NAT")}},
		}},
		Tags: &computepb.Tags{Items: []string{p.cfg.NetworkTag}},
		Labels: map[string]string{
			labelManagedBy: providers.ManagedByValue, labelProvider: p.entry,
			labelOwnerUID: string(req.Owner.UID), labelGeneration: fmt.Sprint(req.Owner.Generation),
		},
		Metadata: &computepb.Metadata{Items: meta},
	}
}

// Create inserts the VM; a retried Insert of the same name is absorbed.
func (p *Provider) Create(ctx context.Context, req *providers.CreateRequest) (*providers.Instance, error) {
	if err := p.validate(req); err != nil {
		return nil, err
	}
	zone := req.Placement.Zone
	_, err := p.c.Insert(ctx, &computepb.InsertInstanceRequest{Project: p.cfg.Project, Zone: zone, InstanceResource: p.instanceResource(req)})
	var ge *googleapi.Error
	switch {
	case err == nil:
		return &providers.Instance{ProviderID: ProviderID(p.cfg.Project, zone, req.Name), Name: req.Name, State: providers.StatePending, Owner: req.Owner}, nil
	case errors.As(err, &ge) && ge.Code == http.StatusConflict:
		inst, gerr := p.Get(ctx, ProviderID(p.cfg.Project, zone, req.Name))
		if gerr != nil {
			return nil, gerr
		}
		if inst.Owner.UID != req.Owner.UID {
			return nil, providers.NewInvalidConfig("instance %s exists and belongs to another owner (uid %q)", req.Name, inst.Owner.UID)
		}
		return inst, nil
	default:
		return nil, classify(err)
	}
}

// classify maps Google API errors to the contract's kinds.
func classify(err error) error {
	var ge *googleapi.Error
	if !errors.As(err, &ge) {
		return err
	}
	reasons := []string{}
	for _, e := range ge.Errors {
		reasons = append(reasons, e.Reason)
	}
	all := strings.ToUpper(strings.Join(reasons, " ") + " " + ge.Message)
	switch {
	case ge.Code == http.StatusNotFound:
		return &providers.NotFoundError{Err: err}
	case ge.Code == http.StatusTooManyRequests, strings.Contains(all, "QUOTA"), strings.Contains(all, "RESOURCE_POOL_EXHAUSTED"),
		strings.Contains(all, "RATELIMITEXCEEDED"), strings.Contains(all, "RESOURCEEXHAUSTED"), strings.Contains(all, "STOCKOUT"):
		return providers.NewQuota(err)
	case ge.Code == http.StatusForbidden, ge.Code == http.StatusBadRequest, ge.Code == http.StatusUnauthorized:
		return providers.NewInvalidConfig("Compute API %d: %s", ge.Code, ge.Message)
	default:
		return err
	}
}

// Get reads the VM.
func (p *Provider) Get(ctx context.Context, id string) (*providers.Instance, error) {
	project, zone, name, err := parseID(id)
	if err != nil {
		return nil, err
	}
	vm, err := p.c.Get(ctx, &computepb.GetInstanceRequest{Project: project, Zone: zone, Instance: name})
	if err != nil {
		return nil, classify(err)
	}
	return p.instance(project, zone, vm), nil
}

func (p *Provider) instance(project, zone string, vm *computepb.Instance) *providers.Instance {
	labels := vm.GetLabels()
	inst := &providers.Instance{ProviderID: ProviderID(project, zone, vm.GetName()), Name: vm.GetName(), State: providers.StatePending}
	if o, ok := providers.OwnerFromTags(map[string]string{
		providers.TagOwnerUID: labels[labelOwnerUID], providers.TagGeneration: labels[labelGeneration],
	}, "", ""); ok {
		inst.Owner = o
	} else {
		inst.Owner = providers.Owner{UID: types.UID("")}
	}
	for _, it := range vm.GetMetadata().GetItems() {
		if it.GetKey() == metadataOwner {
			inst.Owner.Namespace, inst.Owner.Name, _ = strings.Cut(it.GetValue(), "/")
		}
	}
	if t, err := time.Parse(time.RFC3339, vm.GetCreationTimestamp()); err == nil {
		inst.CreatedAt = t
	}
	if nics := vm.GetNetworkInterfaces(); len(nics) > 0 && len(nics[0].GetAccessConfigs()) > 0 {
		inst.IP = nics[0].GetAccessConfigs()[0].GetNatIP()
	}
	switch vm.GetStatus() {
	case "RUNNING":
		inst.State = providers.StateRunning
	case "STOPPING":
		inst.State = providers.StateTerminating
	case "TERMINATED", "SUSPENDED", "SUSPENDING", "REPAIRING":
		inst.State = providers.StateFailed
	}
	return inst
}

// Delete deletes the VM (and, through autoDelete, its boot disk).
func (p *Provider) Delete(ctx context.Context, id string) error {
	project, zone, name, err := parseID(id)
	if err != nil {
		return err
	}
	_, err = p.c.Delete(ctx, &computepb.DeleteInstanceRequest{Project: project, Zone: zone, Instance: name})
	return providers.IgnoreNotFound(classify(err))
}

// List pages through AggregatedList, filtered to this entry's labels, in
// every zone.
func (p *Provider) List(ctx context.Context) ([]*providers.Instance, error) {
	filter := fmt.Sprintf("labels.%s = %s AND labels.%s = %s", labelManagedBy, providers.ManagedByValue, labelProvider, p.entry)
	it := p.c.AggregatedList(ctx, &computepb.AggregatedListInstancesRequest{Project: p.cfg.Project, Filter: &filter})
	var out []*providers.Instance
	for {
		pair, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if err != nil {
			return out, classify(err)
		}
		zone := pair.Key[strings.LastIndex(pair.Key, "/")+1:]
		for _, vm := range pair.Value.GetInstances() {
			if vm.GetLabels()[labelOwnerUID] == "" || vm.GetLabels()[labelProvider] != p.entry {
				continue
			}
			out = append(out, p.instance(p.cfg.Project, zone, vm))
		}
	}
}
