package providers

import (
	"strconv"

	"k8s.io/apimachinery/pkg/types"
)

// Ownership tags. Providers whose backends allow these keys use them as
// they are (Kubernetes labels); others map them to their own rules and say
// so in their docs. Every provider stores all four, because orphan GC needs
// the owner's UID and the generation, and humans need the owner's name.
const (
	// TagManagedBy marks every instance this project created.
	TagManagedBy = "app.kubernetes.io/managed-by"
	// ManagedByValue is TagManagedBy's value.
	ManagedByValue = "egress-proxies"
	// TagProvider is the providers-config entry that created the instance,
	// so two entries of one type never collect each other's instances.
	TagProvider = "crawl.example.com/provider"
	// TagOwnerUID is the owning Proxy's UID: GC matches owners by UID,
	// never by name.
	TagOwnerUID = "crawl.example.com/owner-uid"
	// TagGeneration is the Proxy's status.instanceGeneration at create time.
	TagGeneration = "crawl.example.com/instance-generation"
	// TagOwner is "namespace/name" of the owning Proxy (an annotation where
	// label values cannot hold a '/').
	TagOwner = "crawl.example.com/owner"
)

// OwnerTags returns the label-safe tags for o.
func OwnerTags(entry string, o Owner) map[string]string {
	return map[string]string{
		TagManagedBy:  ManagedByValue,
		TagProvider:   entry,
		TagOwnerUID:   string(o.UID),
		TagGeneration: strconv.FormatInt(o.Generation, 10),
	}
}

// OwnerFromTags reads back what OwnerTags wrote; ok is false when the
// instance carries no owner UID (never ours to collect).
func OwnerFromTags(tags map[string]string, namespace, name string) (Owner, bool) {
	uid := tags[TagOwnerUID]
	if uid == "" {
		return Owner{}, false
	}
	gen, _ := strconv.ParseInt(tags[TagGeneration], 10, 64)
	return Owner{UID: types.UID(uid), Namespace: namespace, Name: name, Generation: gen}, true
}
