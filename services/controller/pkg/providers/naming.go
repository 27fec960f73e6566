package providers

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// InstanceName is the deterministic name of a Proxy's instance of one
// generation: "px-<name>-<uid hash>-<generation>", at most 63 characters of
// [a-z0-9-] starting with a letter, which fits every provider's rules (GCP
// instance names, pod names, libvirt domains). The UID hash keeps two
// Proxies of the same name in different namespaces, or a Proxy recreated
// under an old name, from ever sharing an instance.
func InstanceName(name string, uid types.UID, generation int64) string {
	sum := sha256.Sum256([]byte(uid))
	suffix := fmt.Sprintf("-%s-%d", hex.EncodeToString(sum[:])[:8], generation)
	clean := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r + ('a' - 'A')
		default:
			return '-'
		}
	}, name)
	max := 63 - len("px-") - len(suffix)
	if len(clean) > max {
		clean = clean[:max]
	}
	return "px-" + strings.Trim(clean, "-") + suffix
}
