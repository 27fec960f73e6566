package fake_test

import (
	"testing"

	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/fake"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/providertest"
)

func TestContract(t *testing.T) {
	providertest.Run(t, &providertest.Harness{
		Provider: fake.New("fake"),
		Request: func(name string, o providers.Owner) *providers.CreateRequest {
			return &providers.CreateRequest{Name: name, Owner: o, Port: 3128}
		},
	})
}
