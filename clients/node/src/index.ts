// @egress-proxies/client: lease healthy proxies from an egress-proxies
// broker over gRPC. The crawlee integration is @egress-proxies/client/crawlee.
export { Client, Lease, baseUrl } from "./client.js";
export type { ClientOptions, LeaseRequest, Proxy, ProxyEvent, Report, ReportOptions } from "./client.js";
export { EgressProxiesError, InvalidRequest, LeaseGone, NoProxyAvailable, TargetPaced, Unauthenticated } from "./errors.js";
export { BLOCK_MARKERS, CONNECT_STATUS, MARKERS, RESULTS, SCAN, classify, classifyConnect, classifyError } from "./policy.js";
export type { Result } from "./policy.js";
export const API_VERSION = "v1";
