package providers

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// Entry is one named instance of a provider type in the providers config:
//
//	providers:
//	  - name: gcp-eu        # what spec.provider refers to
//	    type: gcp           # which implementation
//	    gcp: {project: ...} # that type's block, decoded by its factory
type Entry struct {
	Name string
	Type string
	// Block is the type's block as JSON; DecodeBlock decodes it strictly.
	Block json.RawMessage
}

// LoadConfig reads and checks a providers config file. knownTypes are the
// types a factory exists for. Every error names the entry and field.
func LoadConfig(path string, knownTypes []string) ([]Entry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("providers config: %w", err)
	}
	entries, err := ParseConfig(b, knownTypes)
	if err != nil {
		return nil, fmt.Errorf("providers config %s: %w", path, err)
	}
	return entries, nil
}

// ParseConfig parses the YAML of a providers config.
func ParseConfig(data []byte, knownTypes []string) ([]Entry, error) {
	var file struct {
		Providers []map[string]json.RawMessage `json:"providers"`
	}
	if err := yaml.UnmarshalStrict(data, &file); err != nil {
		return nil, fmt.Errorf("parsing: %w", err)
	}
	known := map[string]bool{}
	for _, t := range knownTypes {
		known[t] = true
	}
	seen := map[string]bool{}
	entries := make([]Entry, 0, len(file.Providers))
	for i, raw := range file.Providers {
		var e Entry
		where := fmt.Sprintf("providers[%d]", i)
		if err := str(raw, "name", &e.Name); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if e.Name == "" {
			return nil, fmt.Errorf("%s: name is required", where)
		}
		where = fmt.Sprintf("providers[%d] (%s)", i, e.Name)
		if errs := validation.IsDNS1123Label(e.Name); len(errs) > 0 {
			return nil, fmt.Errorf("%s: name %q must be a DNS label: %s", where, e.Name, strings.Join(errs, "; "))
		}
		if seen[e.Name] {
			return nil, fmt.Errorf("%s: duplicate name %q", where, e.Name)
		}
		seen[e.Name] = true
		if err := str(raw, "type", &e.Type); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if e.Type == "" {
			return nil, fmt.Errorf("%s: type is required", where)
		}
		if !known[e.Type] {
			return nil, fmt.Errorf("%s: unknown type %q (known: %v)", where, e.Type, sorted(knownTypes))
		}
		for k, v := range raw {
			switch k {
			case "name", "type":
			case e.Type:
				e.Block = v
			default:
				return nil, fmt.Errorf("%s: unknown field %q (the settings of type %s go under %q)", where, k, e.Type, e.Type)
			}
		}
		entries = append(entries, e)
	}
	return entries, nil
}

// DecodeBlock decodes the entry's block into cfg, rejecting unknown
// fields. A missing block decodes as empty.
func (e Entry) DecodeBlock(cfg any) error {
	if len(e.Block) == 0 || string(e.Block) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(e.Block))
	dec.DisallowUnknownFields()
	if err := dec.Decode(cfg); err != nil {
		return fmt.Errorf("provider %s: %s: %w", e.Name, e.Type, err)
	}
	return nil
}

func str(raw map[string]json.RawMessage, key string, out *string) error {
	v, ok := raw[key]
	if !ok {
		return nil
	}
	if err := json.Unmarshal(v, out); err != nil {
		return fmt.Errorf("%s must be a string", key)
	}
	return nil
}

func sorted(s []string) []string {
	c := append([]string(nil), s...)
	sort.Strings(c)
	return c
}
