// Command ownersdoc writes the "Who writes what" table of docs/api.md
// from v1alpha1.StatusWriters, between its generated-block markers, so
// the table says what the code enforces (make generate runs it; make
// verify-generated fails on drift).
package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

const (
	begin = "<!-- BEGIN GENERATED: who writes what (pkg/api/v1alpha1/owners.go; make generate) -->\n"
	end   = "<!-- END GENERATED: who writes what -->\n"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: ownersdoc docs/api.md")
		os.Exit(2)
	}
	if err := rewrite(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "ownersdoc:", err)
		os.Exit(1)
	}
}

func rewrite(path string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	i, j := bytes.Index(doc, []byte(begin)), bytes.Index(doc, []byte(end))
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %q ... %q block", path, strings.TrimSpace(begin), strings.TrimSpace(end))
	}
	var out bytes.Buffer
	out.Write(doc[:i+len(begin)])
	out.WriteString(table(v1.StatusWriters))
	out.Write(doc[j:])
	return os.WriteFile(path, out.Bytes(), 0o644)
}

func table(ws []v1.StatusWriter) string {
	var b strings.Builder
	b.WriteString("| status of | fields and conditions | writer | also writes |\n| --- | --- | --- | --- |\n")
	for _, w := range ws {
		what := "all"
		if !w.Owns(v1.AllFields) {
			var parts []string
			for _, f := range w.Fields {
				parts = append(parts, "`"+f+"`")
			}
			for _, c := range w.Conditions {
				parts = append(parts, c)
			}
			what = strings.Join(parts, ", ")
		}
		also := w.Also
		if also == "" {
			also = "nothing else"
		}
		fmt.Fprintf(&b, "| %s | %s | `%s`: %s | %s |\n", w.Kind, what, w.Name, w.Who, also)
	}
	return b.String()
}
