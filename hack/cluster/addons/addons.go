// Package addons are what a cluster needs beside its control plane and
// node: cluster DNS and a default StorageClass, as manifests.
package addons

import (
	"bytes"
	"embed"
	"text/template"
)

//go:embed *.yaml
var files embed.FS

// Values fill the manifests.
type Values struct {
	DNSIP            string
	CoreDNSImage     string
	ProvisionerImage string
	HelperImage      string
	// Path is the node directory volumes are made in.
	Path string
}

// Render returns every addon's manifests, one YAML stream.
func Render(v Values) ([]byte, error) {
	var out bytes.Buffer
	for _, name := range []string{"coredns.yaml", "local-path.yaml"} {
		t, err := template.ParseFS(files, name)
		if err != nil {
			return nil, err
		}
		if err := t.Execute(&out, v); err != nil {
			return nil, err
		}
		out.WriteString("\n---\n")
	}
	return out.Bytes(), nil
}
