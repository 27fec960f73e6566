// Command crddoc writes the field reference, docs/api/reference/, from
// the CRDs controller-gen generates into deploy/crds: every field of each
// kind's spec and status, its type, default and validation (markers and
// CEL rules), so the reference says what the API server enforces (make
// generate runs it; make verify-generated fails on drift).
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/egress-proxies/egress-proxies/pkg/gendoc"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: crddoc deploy/crds docs/api/reference")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "crddoc:", err)
		os.Exit(1)
	}
}

func run(crds, out string) error {
	files, err := filepath.Glob(filepath.Join(crds, "*.yaml"))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	var index strings.Builder
	index.WriteString("# Field reference\n\nEvery field of every resource, generated from the CRDs in `deploy/crds` (which `make manifests` generates from `pkg/api/v1alpha1`): its type, default and the validation the API server applies, markers and CEL rules alike. What the fields do: the resource pages one level up.\n\n| kind | short names | scope |\n| --- | --- | --- |\n")
	slices.Sort(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(b, &crd); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		page := strings.ToLower(crd.Spec.Names.Kind) + ".md"
		fmt.Fprintf(&index, "| [%s](%s) | %s | %s |\n", crd.Spec.Names.Kind, page, strings.Join(crd.Spec.Names.ShortNames, ", "), crd.Spec.Scope)
		if err := gendoc.Page(filepath.Join(out, page), "deploy/crds/"+filepath.Base(f), kind(&crd)); err != nil {
			return err
		}
	}
	return gendoc.Page(filepath.Join(out, "README.md"), "deploy/crds", index.String())
}

// kind is one CRD's page: each served version's fields, depth first.
func kind(crd *apiextensionsv1.CustomResourceDefinition) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n`%s`, ", crd.Spec.Names.Kind, crd.Spec.Group)
	for _, v := range crd.Spec.Versions {
		if !v.Served || v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
			continue
		}
		fmt.Fprintf(&b, "version `%s`. A field's validation is the API server's: a write that breaks it is refused naming the field.\n\n", v.Name)
		root := v.Schema.OpenAPIV3Schema
		for _, r := range root.XValidations {
			fmt.Fprintf(&b, "- whole object: %s\n", rule(r))
		}
		for _, top := range []string{"spec", "status"} {
			s, ok := root.Properties[top]
			if !ok {
				continue
			}
			fmt.Fprintf(&b, "\n## %s\n\n| field | type | default | validation | description |\n| --- | --- | --- | --- | --- |\n", top)
			fields(&b, top, &s, requiredOf(root, top))
		}
	}
	return b.String()
}

func requiredOf(parent *apiextensionsv1.JSONSchemaProps, name string) bool {
	return slices.Contains(parent.Required, name)
}

// fields writes s's row, then its children's: object properties by
// name, and an array's items under path[*].
func fields(b *strings.Builder, path string, s *apiextensionsv1.JSONSchemaProps, required bool) {
	fmt.Fprintf(b, "| `%s` | %s | %s | %s | %s |\n", path, typeOf(s), defaultOf(s), gendoc.Cell(validation(s, required)), gendoc.Cell(summary(s.Description)))
	names := make([]string, 0, len(s.Properties))
	for n := range s.Properties {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		c := s.Properties[n]
		fields(b, path+"."+n, &c, requiredOf(s, n))
	}
	if s.Items != nil && s.Items.Schema != nil && (len(s.Items.Schema.Properties) > 0 || s.Items.Schema.Type == "array") {
		fields(b, path+"[*]", s.Items.Schema, false)
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil && len(s.AdditionalProperties.Schema.Properties) > 0 {
		fields(b, path+"[*]", s.AdditionalProperties.Schema, false)
	}
}

func typeOf(s *apiextensionsv1.JSONSchemaProps) string {
	switch {
	case s.XIntOrString:
		return "int or string"
	case s.Type == "array" && s.Items != nil && s.Items.Schema != nil:
		return "[]" + typeOf(s.Items.Schema)
	case s.Type == "object" && s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil:
		return "map[string]" + typeOf(s.AdditionalProperties.Schema)
	case s.Format != "" && s.Type == "string":
		return "string (" + s.Format + ")"
	case s.Type == "":
		return "any"
	}
	return s.Type
}

func defaultOf(s *apiextensionsv1.JSONSchemaProps) string {
	if s.Default == nil {
		return ""
	}
	return "`" + gendoc.Cell(string(s.Default.Raw)) + "`"
}

// validation is every constraint on s, in words.
func validation(s *apiextensionsv1.JSONSchemaProps, required bool) string {
	var v []string
	if required {
		v = append(v, "required")
	}
	if len(s.Enum) > 0 {
		vals := make([]string, len(s.Enum))
		for i, e := range s.Enum {
			vals[i] = string(e.Raw)
		}
		v = append(v, "one of "+strings.Join(vals, ", "))
	}
	bound := func(name string, f *float64, exclusive bool) {
		if f != nil {
			op := map[bool]string{true: ">", false: "≥"}[exclusive]
			if name == "max" {
				op = map[bool]string{true: "<", false: "≤"}[exclusive]
			}
			v = append(v, op+" "+strconv.FormatFloat(*f, 'f', -1, 64))
		}
	}
	bound("min", s.Minimum, s.ExclusiveMinimum)
	bound("max", s.Maximum, s.ExclusiveMaximum)
	count := func(what string, lo, hi *int64) {
		switch {
		case lo != nil && hi != nil:
			v = append(v, fmt.Sprintf("%d-%d %s", *lo, *hi, what))
		case lo != nil:
			v = append(v, fmt.Sprintf("at least %d %s", *lo, what))
		case hi != nil:
			v = append(v, fmt.Sprintf("at most %d %s", *hi, what))
		}
	}
	count("characters", s.MinLength, s.MaxLength)
	count("items", s.MinItems, s.MaxItems)
	count("keys", s.MinProperties, s.MaxProperties)
	if s.Pattern != "" {
		v = append(v, "matches `"+s.Pattern+"`")
	}
	if s.XListType != nil && *s.XListType == "set" {
		v = append(v, "unique items")
	}
	for _, r := range s.XValidations {
		v = append(v, rule(r))
	}
	return strings.Join(v, "; ")
}

func rule(r apiextensionsv1.ValidationRule) string {
	if r.Message != "" {
		return "`" + r.Rule + "` (" + r.Message + ")"
	}
	return "`" + r.Rule + "`"
}

// summary is a description's first sentence: the page is an index of
// fields; the resource pages say the rest.
func summary(d string) string {
	d = strings.Join(strings.Fields(d), " ")
	if i := strings.Index(d, ". "); i > 0 {
		d = d[:i+1]
	}
	return d
}
