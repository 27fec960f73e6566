package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

// patch applies a JSON merge patch to obj (named by key), after printing
// it; with dryRun the API server checks it and nothing is stored.
func (e *env) patch(ctx context.Context, obj client.Object, key client.ObjectKey, body map[string]any, dryRun bool) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	kind := fmt.Sprintf("%T", obj)[len("*v1alpha1."):]
	suffix := ""
	if dryRun {
		suffix = " (dry run: nothing changes)"
	}
	fmt.Fprintf(e.out, "kubectl patch %s %s -n %s --type=merge -p '%s'%s\n", kind, key.Name, key.Namespace, b, suffix)
	if err := e.kube.Get(ctx, key, obj); err != nil {
		return fmt.Errorf("reading %s %s: %w", kind, key, err)
	}
	opts := []client.PatchOption{}
	if dryRun {
		opts = append(opts, client.DryRunAll)
	}
	if err := e.kube.Patch(ctx, obj, client.RawPatch(types.MergePatchType, b), opts...); err != nil {
		return fmt.Errorf("patching %s %s: %w", kind, key, err)
	}
	return nil
}

func annotations(kv map[string]any) map[string]any {
	return map[string]any{"metadata": map[string]any{"annotations": kv}}
}

func (e *env) cordonCmd(on bool) *cobra.Command {
	var dryRun bool
	use, short := "cordon <proxy>", "Stop new leases to a proxy; its live leases run and renew as before"
	if !on {
		use, short = "uncordon <proxy>", "Let a cordoned proxy be leased again"
	}
	cmd := &cobra.Command{
		Use: use, Short: short, Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var v any = "true"
			if !on {
				v = nil // a merge patch's null removes the key
			}
			return e.patch(cmd.Context(), &v1.Proxy{}, client.ObjectKey{Namespace: e.namespace, Name: args[0]},
				annotations(map[string]any{v1.AnnotationCordoned: v}), dryRun)
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print and check the patch, change nothing")
	return cmd
}

func (e *env) drainCmd() *cobra.Command {
	var dryRun bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "drain <proxy>",
		Short: "Drain a proxy as its pool does: no new leases, live ones renew up to the deadline; a pool then deletes and replaces it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout <= 0 {
				return fmt.Errorf("--drain-timeout must be positive: how long live leases may still run")
			}
			deadline := time.Now().Add(timeout).UTC().Format(time.RFC3339)
			return e.patch(cmd.Context(), &v1.Proxy{}, client.ObjectKey{Namespace: e.namespace, Name: args[0]},
				annotations(map[string]any{v1.AnnotationDrainDeadline: deadline}), dryRun)
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print and check the patch, change nothing")
	cmd.Flags().DurationVar(&timeout, "drain-timeout", 10*time.Minute, "how long live leases may still run")
	return cmd
}

func (e *env) rotateCmd() *cobra.Command {
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "rotate <pool>",
		Short: "Replace every member of a pool now, make-before-break within its strategy (sets spec.rolloutAfter)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// The next whole second: creation times have whole seconds,
			// so a member made this second is before it.
			at := time.Now().Truncate(time.Second).Add(time.Second).UTC().Format(time.RFC3339)
			return e.patch(cmd.Context(), &v1.ProxyPool{}, client.ObjectKey{Namespace: e.namespace, Name: args[0]},
				map[string]any{"spec": map[string]any{"rolloutAfter": at}}, dryRun)
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print and check the patch, change nothing")
	return cmd
}
