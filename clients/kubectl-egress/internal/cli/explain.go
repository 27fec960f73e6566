package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
)

// story is what explain prints of one proxy.
type story struct {
	ID         string      `json:"id"`
	Pool       string      `json:"pool,omitempty"`
	Mode       string      `json:"mode"`
	Phase      string      `json:"phase"`
	Address    string      `json:"address,omitempty"`
	EgressIP   string      `json:"egressIP,omitempty"`
	Instance   int64       `json:"instanceGeneration"`
	Conditions []condLine  `json:"conditions,omitempty"`
	Leasable   memberState `json:"leasable"`
	// Brokers is the lease API's ExplainProxy answer.
	Brokers    json.RawMessage `json:"brokers,omitempty"`
	BrokersErr string          `json:"brokersError,omitempty"`
	// Events are the Proxy's, oldest first: its instances, their egress
	// IPs and replacements as the controller told them.
	Events  []eventLine `json:"events,omitempty"`
	brokers *leasev1.ExplainProxyResponse
}

type condLine struct {
	Type, Status, Reason, Message string
	Since                         time.Time
}

type eventLine struct {
	Time         time.Time
	Type, Reason string
	Message      string
	Count        int32
}

func (e *env) explainCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "explain <proxy>",
		Short: "A proxy's story: phase, probes, cooldowns by target, quarantine and who reported it, leases, events",
		Args:  cobra.ExactArgs(1),
		RunE:  func(cmd *cobra.Command, args []string) error { return e.explain(cmd.Context(), args[0]) },
	}
	return e.outputFlag(cmd)
}

func (e *env) explain(ctx context.Context, name string) error {
	var px v1.Proxy
	key := client.ObjectKey{Namespace: e.namespace, Name: name}
	if err := e.kube.Get(ctx, key, &px); err != nil {
		return fmt.Errorf("reading Proxy %s: %w", key, err)
	}
	now := time.Now()
	s := &story{ID: px.Key(), Pool: px.Labels[v1.LabelPool], Mode: string(px.Spec.Mode), Phase: string(px.Status.Phase),
		EgressIP: px.Status.EgressIP, Instance: px.Status.InstanceGeneration}
	if px.Status.IP != "" {
		s.Address = fmt.Sprintf("%s:%d", px.Status.IP, px.Status.Port)
	}
	for _, c := range px.Status.Conditions {
		s.Conditions = append(s.Conditions, condLine{c.Type, string(c.Status), c.Reason, c.Message, c.LastTransitionTime.Time})
	}
	f := &fleet{}
	api, done, err := e.leaseAPI(ctx)
	if err == nil {
		defer done()
		s.brokers, err = api.ExplainProxy(ctx, &leasev1.ExplainProxyRequest{Id: px.Key()})
	}
	if err != nil {
		s.BrokersErr = err.Error()
	} else {
		s.Brokers = protoJSON(s.brokers)
		f.brokers = map[string]*leasev1.Proxy{px.Key(): s.brokers.GetProxy()}
	}
	s.Leasable = f.member(&px, now)
	var evs corev1.EventList
	sel := fields.Set{"involvedObject.name": px.Name, "involvedObject.uid": string(px.UID)}.AsSelector()
	if err := e.kube.List(ctx, &evs, client.InNamespace(px.Namespace), client.MatchingFieldsSelector{Selector: sel}); err == nil {
		for _, ev := range evs.Items {
			t := ev.LastTimestamp.Time
			if t.IsZero() {
				t = ev.EventTime.Time
			}
			s.Events = append(s.Events, eventLine{t, ev.Type, ev.Reason, ev.Message, ev.Count})
		}
		sort.Slice(s.Events, func(a, b int) bool { return s.Events[a].Time.Before(s.Events[b].Time) })
	}
	return e.emit(s, func(w io.Writer) { printStory(w, s, now) })
}

func printStory(w io.Writer, s *story, now time.Time) {
	row(w, "PROXY", s.ID)
	row(w, "POOL", dash(s.Pool))
	row(w, "MODE", s.Mode)
	row(w, "PHASE", dash(s.Phase))
	row(w, "ADDRESS", dash(s.Address))
	row(w, "EGRESS IP", dash(s.EgressIP))
	row(w, "INSTANCE", s.Instance)
	if s.Leasable.Leasable {
		row(w, "LEASABLE", "yes")
	} else {
		row(w, "LEASABLE", "no: "+s.Leasable.Reason+": "+s.Leasable.Why)
	}
	row(w, "")
	row(w, "CONDITION", "STATUS", "REASON", "SINCE", "MESSAGE")
	for _, c := range s.Conditions {
		row(w, c.Type, c.Status, c.Reason, ago(c.Since, now), c.Message)
	}
	row(w, "")
	if s.BrokersErr != "" {
		row(w, "BROKERS", "could not be asked: "+s.BrokersErr)
	} else {
		b := s.brokers
		row(w, "LEASES", b.GetProxy().GetLeaseCount())
		if q := b.GetProxy().GetQuarantinedUntil(); q != nil {
			row(w, "QUARANTINED", "since "+ago(b.GetProxy().GetQuarantinedSince().AsTime(), now)+", until "+ago(q.AsTime(), now))
		}
		if len(b.GetCooldowns()) == 0 {
			row(w, "COOLDOWNS", "none")
		} else {
			row(w, "")
			row(w, "COOLING FOR", "TENANT", "LEVEL", "SINCE", "UNTIL", "KEPT UNDER")
			for _, c := range b.GetCooldowns() {
				row(w, c.GetTarget(), dash(c.GetTenant()), c.GetLevel(), ago(c.GetSince().AsTime(), now), ago(c.GetUntil().AsTime(), now), c.GetKey())
			}
		}
		if len(b.GetErrors()) > 0 {
			row(w, "")
			row(w, "ERROR REPORT", "TENANT", "AT")
			for _, r := range b.GetErrors() {
				row(w, r.GetTarget(), dash(r.GetTenant()), ago(r.GetAt().AsTime(), now))
			}
		}
	}
	if len(s.Events) > 0 {
		row(w, "")
		row(w, "EVENT", "TYPE", "WHEN", "MESSAGE")
		for _, ev := range s.Events {
			msg := ev.Message
			if ev.Count > 1 {
				msg += fmt.Sprintf(" (x%d)", ev.Count)
			}
			row(w, ev.Reason, ev.Type, ago(ev.Time, now), strings.ReplaceAll(msg, "\n", " "))
		}
	}
}

// targetView is what bans prints.
type targetView struct {
	Target json.RawMessage `json:"target"`
	// Refused are the selectors leases were refused for in the last
	// minute, every target together.
	Refused json.RawMessage `json:"refused,omitempty"`
}

func (e *env) bansCmd() *cobra.Command {
	var target string
	cmd := &cobra.Command{
		Use:   "bans --target <host>",
		Short: "A target's view of the fleet: which exits it cooled and until when, its pace, its leases",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if target == "" {
				return fmt.Errorf("--target is required: the site's host name, as crawlers lease for it")
			}
			ctx := cmd.Context()
			api, done, err := e.leaseAPI(ctx)
			if err != nil {
				return err
			}
			defer done()
			resp, err := api.ExplainTarget(ctx, &leasev1.ExplainTargetRequest{Target: target, Namespace: e.scope()})
			if err != nil {
				return fmt.Errorf("ExplainTarget: %w", err)
			}
			v := &targetView{Target: protoJSON(resp)}
			var refused []*leasev1.SelectorRefusals
			if r, err := api.ListRefusals(ctx, &leasev1.ListRefusalsRequest{}); err == nil {
				refused, v.Refused = r.GetSelectors(), protoJSON(r)
			}
			now := time.Now()
			return e.emit(v, func(w io.Writer) {
				row(w, "TARGET", resp.GetTarget())
				row(w, "POLICY", dash(resp.GetPolicy()))
				row(w, "LEASES", resp.GetLeases())
				if resp.GetPacePerSecond() > 0 {
					row(w, "PACED", fmt.Sprintf("%.2f leases/s fleet-wide, until %s", resp.GetPacePerSecond(), ago(resp.GetPacedUntil().AsTime(), now)))
				} else {
					row(w, "PACED", "no")
				}
				row(w, "COOLING", fmt.Sprintf("%d of %d proxies", len(resp.GetCooling()), resp.GetProxies()))
				if len(resp.GetCooling()) > 0 {
					row(w, "")
					row(w, "PROXY", "EGRESS IP", "TENANT", "LEVEL", "SINCE", "UNTIL")
					for _, c := range resp.GetCooling() {
						cd := c.GetCooldown()
						row(w, c.GetProxyId(), dash(c.GetEgressIp()), dash(cd.GetTenant()), cd.GetLevel(), ago(cd.GetSince().AsTime(), now), ago(cd.GetUntil().AsTime(), now))
					}
				}
				if len(refused) > 0 {
					row(w, "")
					row(w, "REFUSED (LAST MINUTE)", "NAMESPACE", "SELECTOR")
					for _, r := range refused {
						row(w, r.GetRefused(), dash(r.GetNamespace()), dash(selector(r.GetSelector())))
					}
				}
			})
		},
	}
	cmd.Flags().StringVar(&target, "target", "", "the site's host name")
	return e.outputFlag(cmd)
}

func selector(m map[string]string) string {
	s := make([]string, 0, len(m))
	for k, v := range m {
		s = append(s, k+"="+v)
	}
	sort.Strings(s)
	return strings.Join(s, ",")
}
