package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
)

// listLeases pages through ListLeases.
func (e *env) listLeases(ctx context.Context, tenant string) ([]*leasev1.Lease, error) {
	api, done, err := e.leaseAPI(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	var out []*leasev1.Lease
	req := &leasev1.ListLeasesRequest{Namespace: e.scope(), Tenant: tenant}
	for {
		resp, err := api.ListLeases(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("ListLeases: %w", err)
		}
		out = append(out, resp.GetLeases()...)
		if resp.GetNextPageToken() == "" {
			return out, nil
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

func (e *env) leasesCmd() *cobra.Command {
	var tenant string
	cmd := &cobra.Command{
		Use:   "leases",
		Short: "Who holds which proxy: live leases by tenant, target, session and age",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ls, err := e.listLeases(cmd.Context(), tenant)
			if err != nil {
				return err
			}
			now := time.Now()
			return e.emit(jsonLeases(ls), func(w io.Writer) {
				row(w, "LEASE", "PROXY", "TENANT", "TARGET", "SESSION", "AGE", "EXPIRES")
				for _, l := range ls {
					row(w, l.GetLeaseId(), l.GetProxyId(), dash(l.GetTenant()), dash(l.GetTarget()), dash(l.GetSessionKey()),
						ago(l.GetGrantedAt().AsTime(), now), ago(l.GetExpiresAt().AsTime(), now))
				}
			})
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "only this tenant's leases")
	return e.outputFlag(cmd)
}

func jsonLeases(ls []*leasev1.Lease) any {
	out := make([]any, len(ls))
	for i, l := range ls {
		out[i] = protoJSON(l)
	}
	return map[string]any{"leases": out}
}

// session is the leases taken with one session key.
type session struct {
	Tenant  string    `json:"tenant,omitempty"`
	Key     string    `json:"key"`
	Proxies []string  `json:"proxies"`
	Targets []string  `json:"targets"`
	Leases  int       `json:"leases"`
	Oldest  time.Time `json:"oldest"`
}

func (e *env) sessionsCmd() *cobra.Command {
	var tenant string
	cmd := &cobra.Command{
		Use:   "sessions",
		Short: "Sticky sessions with live leases: which proxy each holds, for which targets",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ls, err := e.listLeases(cmd.Context(), tenant)
			if err != nil {
				return err
			}
			by := map[string]*session{}
			var all []*session
			for _, l := range ls {
				if l.GetSessionKey() == "" {
					continue
				}
				k := l.GetTenant() + "/" + l.GetSessionKey()
				s, ok := by[k]
				if !ok {
					s = &session{Tenant: l.GetTenant(), Key: l.GetSessionKey(), Oldest: l.GetGrantedAt().AsTime()}
					by[k] = s
					all = append(all, s)
				}
				s.Leases++
				if !slices.Contains(s.Proxies, l.GetProxyId()) {
					s.Proxies = append(s.Proxies, l.GetProxyId())
				}
				if t := dash(l.GetTarget()); !slices.Contains(s.Targets, t) {
					s.Targets = append(s.Targets, t)
				}
				if g := l.GetGrantedAt().AsTime(); g.Before(s.Oldest) {
					s.Oldest = g
				}
			}
			sort.Slice(all, func(a, b int) bool { return all[a].Tenant+"/"+all[a].Key < all[b].Tenant+"/"+all[b].Key })
			now := time.Now()
			return e.emit(map[string]any{"sessions": all}, func(w io.Writer) {
				row(w, "TENANT", "SESSION", "PROXIES", "TARGETS", "LEASES", "AGE")
				for _, s := range all {
					row(w, dash(s.Tenant), s.Key, strings.Join(s.Proxies, ","), strings.Join(s.Targets, ","), s.Leases, ago(s.Oldest, now))
				}
			})
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "only this tenant's sessions")
	return e.outputFlag(cmd)
}
