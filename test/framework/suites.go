package framework

import (
	"fmt"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"

	"github.com/egress-proxies/egress-proxies/pkg/gendoc"
)

// Suite is one system suite, as its package comment describes it.
type Suite struct {
	// Dir is its directory from the repository's root.
	Dir string
	// Proves is what it proves; RunsOn what it runs on (its comment's
	// "Runs on:" paragraph).
	Proves, RunsOn string
}

// Suites reads every suite under root/test/suites from its doc.go.
func Suites(root string) ([]Suite, error) {
	dirs, err := filepath.Glob(filepath.Join(root, "test", "suites", "*", "doc.go"))
	if err != nil {
		return nil, err
	}
	slices.Sort(dirs)
	var out []Suite
	for _, doc := range dirs {
		f, err := parser.ParseFile(token.NewFileSet(), doc, nil, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			return nil, err
		}
		if f.Doc == nil {
			return nil, fmt.Errorf("%s: no package comment saying what the suite proves", doc)
		}
		text := f.Doc.Text()
		proves, runsOn, ok := strings.Cut(text, "Runs on: ")
		if !ok {
			return nil, fmt.Errorf("%s: the package comment has no \"Runs on:\" paragraph", doc)
		}
		rel, _ := filepath.Rel(root, filepath.Dir(doc))
		out = append(out, Suite{Dir: filepath.ToSlash(rel), Proves: oneLine(strings.TrimPrefix(strings.TrimPrefix(proves, "Package "+f.Name.Name+" "), "proves ")), RunsOn: oneLine(runsOn)})
	}
	return out, nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// SuitesTable is the Markdown table of suites.
func SuitesTable(suites []Suite) string {
	var b strings.Builder
	b.WriteString("| suite | runs on | proves |\n| --- | --- | --- |\n")
	for _, s := range suites {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", s.Dir, gendoc.Cell(s.RunsOn), gendoc.Cell(s.Proves))
	}
	return b.String()
}

// WriteSuitesTable writes the table into path's "system suites" block.
func WriteSuitesTable(root, path string) error {
	suites, err := Suites(root)
	if err != nil {
		return err
	}
	if len(suites) == 0 {
		return fmt.Errorf("no suite under %s", filepath.Join(root, "test", "suites"))
	}
	return gendoc.Block(path, "system suites", "test/suites/*/doc.go", SuitesTable(suites))
}
