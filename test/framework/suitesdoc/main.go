// Command suitesdoc writes docs/testing.md's table of the system suites
// from their package comments (test/suites/*/doc.go), so what the table
// says a suite proves is what the suite says of itself (make generate
// runs it; make verify-generated fails on drift).
package main

import (
	"fmt"
	"os"

	"github.com/egress-proxies/egress-proxies/test/framework"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: suitesdoc <repository root> docs/testing.md")
		os.Exit(2)
	}
	if err := framework.WriteSuitesTable(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "suitesdoc:", err)
		os.Exit(1)
	}
}
