package leases

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

func TestStoreErrorsMapToDocumentedCodes(t *testing.T) {
	for _, tc := range []struct {
		err    error
		code   codes.Code
		reason string
	}{
		{store.ErrLeaseNotFound, codes.NotFound, ""},
		{&store.NoCandidateError{}, codes.ResourceExhausted, "NO_MATCHING_PROXY"},
		{&store.NoCandidateError{Stale: 3}, codes.ResourceExhausted, "HEALTH_STALE"},
		{&store.NoCandidateError{Candidates: 2, CoolingDown: 2}, codes.ResourceExhausted, "ALL_COOLING_DOWN"},
		{&store.NoCandidateError{Candidates: 2, AtCap: 2}, codes.ResourceExhausted, "ALL_AT_CAP"},
		{&store.NoCandidateError{Candidates: 2, CoolingDown: 1, AtCap: 1}, codes.ResourceExhausted, "ALL_COOLING_DOWN_OR_AT_CAP"},
		{&store.NoCandidateError{Quarantined: 2}, codes.ResourceExhausted, "ALL_QUARANTINED"},
		{&store.TargetCapError{Target: "a.example", Cap: 3}, codes.ResourceExhausted, "TARGET_AT_CAP"},
		{&store.PacedError{Target: "a.example", Rate: 2, Wait: 300 * time.Millisecond}, codes.ResourceExhausted, "TARGET_PACED"},
		{&store.RequestReusedError{LeaseID: "x"}, codes.AlreadyExists, ""},
		{&store.UnavailableError{Err: errors.New("dial tcp: refused")}, codes.Unavailable, ""},
		{context.Canceled, codes.Canceled, ""},
		{context.DeadlineExceeded, codes.DeadlineExceeded, ""},
		{errors.New("surprise"), codes.Internal, ""},
	} {
		st := status.Convert(storeError(tc.err))
		assert.Equal(t, tc.code, st.Code(), "%v", tc.err)
		var reason string
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok {
				reason = info.GetReason()
				assert.Equal(t, ErrorDomain, info.GetDomain())
			}
		}
		assert.Equal(t, tc.reason, reason, "%v", tc.err)
	}
}
