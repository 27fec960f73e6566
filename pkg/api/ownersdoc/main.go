// Command ownersdoc writes the "Who writes what" table of docs/api/status-writers.md
// from v1alpha1.StatusWriters, between its generated-block markers, so
// the table says what the code enforces (make generate runs it; make
// verify-generated fails on drift).
package main

import (
	"fmt"
	"os"
	"strings"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/gendoc"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: ownersdoc docs/api/status-writers.md")
		os.Exit(2)
	}
	if err := gendoc.Block(os.Args[1], "who writes what", "pkg/api/v1alpha1/owners.go", table(v1.StatusWriters)); err != nil {
		fmt.Fprintln(os.Stderr, "ownersdoc:", err)
		os.Exit(1)
	}
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
