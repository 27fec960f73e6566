// Package broker proves the broker as its callers meet it, each broker a
// process of its own: the quickstart byte for byte, least-loaded leasing,
// cooldown per target and expiry, 2 replicas × 200 racing leases at the
// cap, a SIGKILL restart, a Redis outage, bad input, auth and rotation,
// tenants seeing and leasing only their own, spans from every layer when
// an exporter is set; TLS on gRPC and REST; gRPC health NOT_SERVING while
// Redis is down, reflection; Retry-After and RetryInfo on 429; the OpenAPI
// document's statuses; credentials in a lease only behind a token;
// ban-aware leasing (the waterfall of 10 proxies rate-limited on 6,
// shared and inherited cooldowns, escalation, 16 racing reports starting
// one cooldown, a TargetPolicy's cap across two brokers, sticky sessions,
// quarantine by error on 3 targets, --ban-aware=false keeping the seed's
// rule); every Redis key one schema.go declares (TestEveryKeyIsDeclared);
// safe by default (reports for another target refused, quarantine held at
// 3 of 10, a token's caps, a full Redis refusing with STORE_FULL, kill -9
// of Redis restarted from its AOF, Redis over TLS with an ACL user and a
// rotated password, 900 slow and silent connections cut at their limits);
// the proxy gateway (HTTPS tunnels through leased proxies spread by load,
// sessions, every refusal with no lease taken and nothing in the Squids'
// logs, renewals past the TTL, whose fault across a broad crawl of 200
// hosts, a third dead, with no proxy blamed, a hostile site's forged Squid
// pages blaming none, a killed Squid blamed and hidden by the retry); and
// the web console in a real headless Chromium. Its benchmarks are make
// bench-broker, bench-gateway and bench-console.
//
// Runs on: broker processes, real Redis (TLS, ACL users, Sentinel,
// maxmemory), envtest, real Squids asking for credentials, TLS and plain
// sites, headless Chromium.
package broker
