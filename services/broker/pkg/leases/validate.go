package leases

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation"
)

var (
	leaseIDPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)
	keyPattern     = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	hostPattern    = regexp.MustCompile(`^[A-Za-z0-9_]([-A-Za-z0-9_.:\[\]]{0,251}[A-Za-z0-9_\]])?$`)
	requestPattern = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,64}$`)
	sessionPattern = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,128}$`)
)

func checkRequestID(id string) error {
	if id != "" && !requestPattern.MatchString(id) {
		return invalid("requestId", "must be 1-64 letters, digits, '-', '_', '.' or ':' (a UUID is a good choice)")
	}
	return nil
}

func checkSessionKey(k string) error {
	if k != "" && !sessionPattern.MatchString(k) {
		return invalid("sessionKey", "must be 1-128 letters, digits, '-', '_', '.' or ':'")
	}
	return nil
}

func invalid(field, format string, args ...any) error {
	st := status.New(codes.InvalidArgument, field+": "+fmt.Sprintf(format, args...))
	st, _ = st.WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: fmt.Sprintf(format, args...)}}})
	return st.Err()
}

func checkLeaseID(id string) error {
	if !leaseIDPattern.MatchString(id) {
		return invalid("leaseID", "must be the 32 lower-case hex characters CreateLease returned")
	}
	return nil
}

func checkSelector(sel map[string]string) error {
	if len(sel) > 32 {
		return invalid("selector", "at most 32 pairs")
	}
	for k, v := range sel {
		if !keyPattern.MatchString(k) {
			return invalid("selector", "key %q must be 1-63 characters of letters, digits, '-', '_' or '.'", k)
		}
		if v == "" {
			return invalid("selector."+k, "must not be empty")
		}
		if len(v) > 63 {
			return invalid("selector."+k, "must be at most 63 characters")
		}
	}
	return nil
}

func checkNamespace(ns string) error {
	if ns == "" {
		return nil
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return invalid("namespace", "%q is not a namespace name: %s", ns, strings.Join(errs, "; "))
	}
	return nil
}

func checkTarget(t string) error {
	if t != "" && !hostPattern.MatchString(t) {
		return invalid("target", "must be a host name such as example.com")
	}
	return nil
}

func (s *Service) ttl(secs int32) (time.Duration, error) {
	if secs == 0 {
		return s.cfg.DefaultTTL, nil
	}
	d := time.Duration(secs) * time.Second
	if d < s.cfg.MinTTL || d > s.cfg.MaxTTL {
		return 0, invalid("ttlSeconds", "must be between %d and %d (0 means the default, %d)",
			int(s.cfg.MinTTL.Seconds()), int(s.cfg.MaxTTL.Seconds()), int(s.cfg.DefaultTTL.Seconds()))
	}
	return d, nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func checkOutcome(o store.Outcome) error {
	if o.Valid() {
		return nil
	}
	return invalid("result", "must be one of ok, rate_limited, blocked, error, target_error (got %q)", string(o))
}

// checkRange accepts 0 (not given) or a value in [lo, hi].
func checkRange(field string, v, lo, hi int32) error {
	if v != 0 && (v < lo || v > hi) {
		return invalid(field, "must be between %d and %d, or 0 when unknown (got %d)", lo, hi, v)
	}
	return nil
}
