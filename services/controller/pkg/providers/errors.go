package providers

import (
	"errors"
	"fmt"
)

// The typed errors of the contract. Providers wrap backend errors in them;
// the reconciler acts on the kind:
//
//	NotFoundError      the instance is gone
//	QuotaError         out of quota or capacity: wait and retry, not Failed
//	InvalidConfigError the request or config cannot work: Failed, no retry
//	anything else      transient: retry with backoff
type (
	// NotFoundError: the instance does not exist.
	NotFoundError struct{ Err error }
	// QuotaError: the backend is out of quota or capacity.
	QuotaError struct{ Err error }
	// InvalidConfigError: the request or entry config is wrong; retrying
	// cannot help until a human changes it.
	InvalidConfigError struct{ Err error }
)

func (e *NotFoundError) Error() string      { return "instance not found: " + e.Err.Error() }
func (e *NotFoundError) Unwrap() error      { return e.Err }
func (e *QuotaError) Error() string         { return "quota or capacity exhausted: " + e.Err.Error() }
func (e *QuotaError) Unwrap() error         { return e.Err }
func (e *InvalidConfigError) Error() string { return e.Err.Error() }
func (e *InvalidConfigError) Unwrap() error { return e.Err }

// NewNotFound returns a NotFoundError.
func NewNotFound(format string, args ...any) error {
	return &NotFoundError{fmt.Errorf(format, args...)}
}

// NewQuota wraps err as a QuotaError.
func NewQuota(err error) error { return &QuotaError{err} }

// NewInvalidConfig returns an InvalidConfigError.
func NewInvalidConfig(format string, args ...any) error {
	return &InvalidConfigError{fmt.Errorf(format, args...)}
}

// IsNotFound reports whether err is or wraps a NotFoundError.
func IsNotFound(err error) bool { var e *NotFoundError; return errors.As(err, &e) }

// IgnoreNotFound returns nil for a NotFoundError and err otherwise.
func IgnoreNotFound(err error) error {
	if IsNotFound(err) {
		return nil
	}
	return err
}

// IsQuota reports whether err is or wraps a QuotaError.
func IsQuota(err error) bool { var e *QuotaError; return errors.As(err, &e) }

// IsInvalidConfig reports whether err is or wraps an InvalidConfigError.
func IsInvalidConfig(err error) bool { var e *InvalidConfigError; return errors.As(err, &e) }

// Kind names err's kind for metrics and logs: not_found, quota,
// invalid_config, transient, or none.
func Kind(err error) string {
	switch {
	case err == nil:
		return "none"
	case IsNotFound(err):
		return "not_found"
	case IsQuota(err):
		return "quota"
	case IsInvalidConfig(err):
		return "invalid_config"
	default:
		return "transient"
	}
}
