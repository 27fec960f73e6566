// Package fake is an in-memory provider for reconciler tests that need
// failures a real backend cannot be made to produce on demand (a Delete
// that keeps failing, invalid placement of a provider that requires it).
// It passes the same contract suite as the real providers, so it behaves
// as the contract says.
package fake

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
)

// Provider keeps instances in memory. Instances run with an IP at once.
type Provider struct {
	Entry string
	// RequirePlacement lists placement fields Create requires, as
	// "zone", "machineType", "image".
	RequirePlacement []string
	// CreateErr, when set, is consulted before every Create.
	CreateErr func(req *providers.CreateRequest) error
	// DeleteErr, when set, is returned by every Delete.
	DeleteErr func() error

	mu        sync.Mutex
	instances map[string]*providers.Instance
	nextIP    int
	calls     map[string]int
}

var _ providers.Provider = (*Provider)(nil)

// New returns an empty provider for entry.
func New(entry string) *Provider {
	return &Provider{Entry: entry, instances: map[string]*providers.Instance{}, calls: map[string]int{}}
}

// Calls returns how often method was called.
func (p *Provider) Calls(method string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[method]
}

// Len returns the number of instances.
func (p *Provider) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.instances)
}

func (p *Provider) id(name string) string { return "fake://" + p.Entry + "/" + name }

// Create implements providers.Provider.
func (p *Provider) Create(_ context.Context, req *providers.CreateRequest) (*providers.Instance, error) {
	p.mu.Lock()
	p.calls["Create"]++
	p.mu.Unlock()
	for _, f := range p.RequirePlacement {
		v := map[string]string{"zone": req.Placement.Zone, "machineType": req.Placement.MachineType, "image": req.Placement.Image}[f]
		if v == "" {
			return nil, providers.NewInvalidConfig("spec.placement.%s is required by provider %s", f, p.Entry)
		}
	}
	if p.CreateErr != nil {
		if err := p.CreateErr(req); err != nil {
			return nil, err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if inst, ok := p.instances[req.Name]; ok {
		if inst.Owner.UID != req.Owner.UID {
			return nil, fmt.Errorf("instance %s belongs to %s", req.Name, inst.Owner.UID)
		}
		c := *inst
		return &c, nil
	}
	p.nextIP++
	inst := &providers.Instance{
		ProviderID: p.id(req.Name), Name: req.Name, State: providers.StateRunning,
		IP: fmt.Sprintf("127.1.%d.%d", p.nextIP/250, p.nextIP%250+1), CreatedAt: time.Now(), Owner: req.Owner,
	}
	p.instances[req.Name] = inst
	c := *inst
	return &c, nil
}

func (p *Provider) name(id string) (string, error) {
	name, ok := strings.CutPrefix(id, "fake://"+p.Entry+"/")
	if !ok || name == "" {
		return "", providers.NewInvalidConfig("providerID %q is not fake://%s/<name>", id, p.Entry)
	}
	return name, nil
}

// Get implements providers.Provider.
func (p *Provider) Get(_ context.Context, id string) (*providers.Instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls["Get"]++
	name, err := p.name(id)
	if err != nil {
		return nil, err
	}
	inst, ok := p.instances[name]
	if !ok {
		return nil, providers.NewNotFound("%s", id)
	}
	c := *inst
	return &c, nil
}

// Delete implements providers.Provider.
func (p *Provider) Delete(_ context.Context, id string) error {
	p.mu.Lock()
	p.calls["Delete"]++
	p.mu.Unlock()
	if p.DeleteErr != nil {
		if err := p.DeleteErr(); err != nil {
			return err
		}
	}
	name, err := p.name(id)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.instances, name)
	return nil
}

// List implements providers.Provider.
func (p *Provider) List(context.Context) ([]*providers.Instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls["List"]++
	out := make([]*providers.Instance, 0, len(p.instances))
	for _, inst := range p.instances {
		c := *inst
		out = append(out, &c)
	}
	return out, nil
}

// Factory returns a providers.Factory that hands out p.
func (p *Provider) Factory() providers.Factory {
	return func(context.Context, providers.Entry, providers.Deps) (providers.Provider, error) { return p, nil }
}
