package app

import (
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/gcp"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kubernetes"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kvm"
)

// defaultProvidersConfig is used without --providers-config.
const defaultProvidersConfig = "providers:\n  - name: kubernetes\n    type: kubernetes\n"

// factories maps every provider type to its constructor.
var factories = map[string]providers.Factory{
	kubernetes.Type: kubernetes.New,
	gcp.Type:        gcp.New,
	kvm.Type:        kvm.New,
	kvm.Type2:       kvm.New2,
}

func loadEntries(path string) ([]providers.Entry, error) {
	types := make([]string, 0, len(factories))
	for t := range factories {
		types = append(types, t)
	}
	if path == "" {
		return providers.ParseConfig([]byte(defaultProvidersConfig), types)
	}
	return providers.LoadConfig(path, types)
}
