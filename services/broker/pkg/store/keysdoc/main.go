// Command keysdoc writes the table of the broker's Redis keys in
// docs/components/broker.md from store.Schema, between its
// generated-block markers, so the page lists every key the scripts may
// write as schema.go declares it (make generate runs it; make
// verify-generated fails on drift).
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/egress-proxies/egress-proxies/pkg/gendoc"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: keysdoc docs/components/broker.md")
		os.Exit(2)
	}
	if err := gendoc.Block(os.Args[1], "redis keys", "services/broker/pkg/store/schema.go", table(store.Schema)); err != nil {
		fmt.Fprintln(os.Stderr, "keysdoc:", err)
		os.Exit(1)
	}
}

func table(keys []store.Key) string {
	var b strings.Builder
	b.WriteString("| key | type | holds | expires, or what bounds it | written by |\n| --- | --- | --- | --- | --- |\n")
	for _, k := range keys {
		life := k.Expires
		if life == "" {
			life = "no TTL: " + k.Permanent
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", gendoc.Cell(k.Pattern), k.Type, gendoc.Cell(k.Holds), gendoc.Cell(life), gendoc.Cell(strings.Join(k.Writers, ", ")))
	}
	return b.String()
}
