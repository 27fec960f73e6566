"""Report results (docs/api/clients.md, ReportLease and "Whose fault"): ERROR is the
proxy's own failure, TARGET_ERROR the site's through a working proxy."""
OK, RATE_LIMITED, BLOCKED, ERROR, TARGET_ERROR = "ok", "rate_limited", "blocked", "error", "target_error"
RESULTS = (OK, RATE_LIMITED, BLOCKED, ERROR, TARGET_ERROR)
