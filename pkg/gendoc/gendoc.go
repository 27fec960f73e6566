// Package gendoc writes the generated parts of the docs: a block of a
// hand-written page between markers, or a whole page. Every reference
// that can be read off the code (status writers, Redis keys, CRD fields)
// is written this way by make generate, and make verify-generated fails
// when a page drifts from what the code says.
package gendoc

import (
	"bytes"
	"fmt"
	"os"
	"strings"
)

// Block replaces what lies between the markers named name in the page at
// path with body: "<!-- BEGIN GENERATED: name (source; make generate) -->"
// and "<!-- END GENERATED: name -->", which must be there already.
func Block(path, name, source, body string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	begin := fmt.Sprintf("<!-- BEGIN GENERATED: %s (%s; make generate) -->\n", name, source)
	end := fmt.Sprintf("<!-- END GENERATED: %s -->\n", name)
	i, j := bytes.Index(doc, []byte(begin)), bytes.Index(doc, []byte(end))
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %q ... %q block", path, bytes.TrimSpace([]byte(begin)), bytes.TrimSpace([]byte(end)))
	}
	var out bytes.Buffer
	out.Write(doc[:i+len(begin)])
	out.WriteString(body)
	out.Write(doc[j:])
	return os.WriteFile(path, out.Bytes(), 0o644)
}

// Page writes a whole generated page, headed by a line saying where it
// comes from.
func Page(path, source, body string) error {
	return os.WriteFile(path, []byte(fmt.Sprintf("<!-- GENERATED from %s by make generate: do not edit -->\n\n%s", source, body)), 0o644)
}

// Cell is s fit for a Markdown table cell: pipes escaped, newlines
// folded.
func Cell(s string) string { return cell.Replace(s) }

var cell = strings.NewReplacer("|", `\|`, "\n", " ")
