package leases

import (
	"context"
	"errors"
	"time"

	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// overQuota is the refusal of a call past one of its tenant's quotas
// (limit, as tokenLimited counts it): RESOURCE_EXHAUSTED with reason,
// naming the tenant, and when to retry (0: the caller must first end
// something it holds).
func overQuota(tenant, limit, reason, msg string, retry time.Duration) error {
	tokenLimited.WithLabelValues(tenant, limit).Inc()
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain, Metadata: map[string]string{"token": tenant}}}
	if retry > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	}
	st, _ := status.New(codes.ResourceExhausted, msg).WithDetails(details...)
	return st.Err()
}

// ErrorDomain is the domain of the ErrorInfo details the service returns.
const ErrorDomain = access.ErrorDomain

// storeError maps store errors to the documented codes.
func storeError(err error) error { return storeErrorFrom(err, access.Limit{}, access.Limit{}) }

func withSource(msg, source string) string {
	if source == "" {
		return msg
	}
	return msg + " (" + source + ")"
}

// storeErrorFrom is storeError for a CreateLease, whose quota refusals
// name where the tenant's quota is set (leases: maxLeases, perMinute:
// leasesPerMinute).
func storeErrorFrom(err error, leases, perMinute access.Limit) error {
	var refused store.Refusal
	var un *store.UnavailableError
	var reused *store.RequestReusedError
	var wrong *store.WrongTargetError
	var capped *store.CallerCapError
	var paced *store.CallerRateError
	switch {
	case errors.Is(err, store.ErrLeaseNotFound):
		return status.Error(codes.NotFound, "lease not found or expired")
	case errors.As(err, &wrong):
		return invalid("target", "%s", wrong.Error())
	case errors.As(err, &capped):
		return overQuota(capped.Caller, "leases", "TOKEN_LEASE_CAP", withSource(capped.Error(), leases.Source), time.Second)
	case errors.As(err, &paced):
		return overQuota(paced.Caller, "leases_per_minute", "TENANT_LEASE_RATE", withSource(paced.Error(), perMinute.Source), paced.Wait)
	case errors.Is(err, store.ErrFull):
		storeFull.Inc()
		st := status.New(codes.ResourceExhausted, store.ErrFull.Error())
		st, _ = st.WithDetails(&errdetails.ErrorInfo{Reason: "STORE_FULL", Domain: ErrorDomain},
			&errdetails.RetryInfo{RetryDelay: durationpb.New(5 * time.Second)})
		return st.Err()
	case errors.As(err, &reused):
		return status.Error(codes.AlreadyExists, reused.Error())
	case errors.As(err, &refused):
		noCandidate.WithLabelValues(refused.Reason()).Inc()
		st := status.New(codes.ResourceExhausted, "no proxy available: "+refused.Error())
		st, _ = st.WithDetails(&errdetails.ErrorInfo{Reason: refused.Reason(), Domain: ErrorDomain, Metadata: refused.Details()},
			&errdetails.RetryInfo{RetryDelay: durationpb.New(refused.RetryAfter())})
		return st.Err()
	case errors.As(err, &un):
		return status.Error(codes.Unavailable, "lease store unavailable; retry (a CreateLease may have been applied: retry it with the same requestId to get that lease rather than a second one)")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	default:
		return status.Error(codes.Internal, err.Error())
	}
}

// notOwner refuses a call on a lease another tenant holds. Lease ids are
// 128 random bits: a caller naming another's has it from that tenant.
func notOwner(t *access.Tenant, id string) error {
	return t.Denied("TENANT_LEASE", "lease %s is another tenant's: only the tenant that took a lease renews, reports on or releases it", id)
}
