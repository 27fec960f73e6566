#!/usr/bin/env bash
# Creates, once, the Secrets `make deploy` cannot have the chart make (the
# probe token, the lease API's token, the gateway's token, the bundled
# Redis's password, the
# proxy credentials key and the probe certificate):
# `helm template` cannot look up what exists, so a chart-made token or
# certificate would be replaced on every apply, cutting every prober off
# until it restarts. An existing Secret is left as it is (rotate it by
# hand; see the README). Usage: deploy-secrets.sh NAMESPACE RELEASE
set -euo pipefail
ns=$1 release=$2
tls=$release-probe-tls
svc=$release-controller-probe

# once SECRET KEY: a random value under KEY, unless SECRET exists.
once() {
  if ! kubectl -n "$ns" get secret "$1" >/dev/null 2>&1; then
    kubectl -n "$ns" create secret generic "$1" --from-literal="$2=$(openssl rand -hex 24)"
  fi
}
once "$release-probe-token" token
once "$release-discovery-token" token
once "$release-gateway-token" token
# The Redis password twice: for the brokers, and as the config file Redis
# reads (the chart's redis.conf key), so it is on no command line.
if ! kubectl -n "$ns" get secret "$release-redis" >/dev/null 2>&1; then
  pw=$(openssl rand -hex 24)
  kubectl -n "$ns" create secret generic "$release-redis" --from-literal=password="$pw" --from-literal=redis.conf="requirepass $pw"
fi
once "$release-proxy-credentials-key" key
if ! kubectl -n "$ns" get secret "$tls" >/dev/null 2>&1; then
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/CN=$release probe CA" -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -subj "/CN=$svc" -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
  printf 'subjectAltName=DNS:%s,DNS:%s.%s,DNS:%s.%s.svc,DNS:%s.%s.svc.cluster.local\nextendedKeyUsage=serverAuth\n' \
    "$svc" "$svc" "$ns" "$svc" "$ns" "$svc" "$ns" >"$dir/ext"
  openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -days 3650 -extfile "$dir/ext" -out "$dir/tls.crt" 2>/dev/null
  kubectl -n "$ns" create secret generic "$tls" --type=kubernetes.io/tls \
    --from-file=tls.crt="$dir/tls.crt" --from-file=tls.key="$dir/tls.key" --from-file=ca.crt="$dir/ca.crt"
fi
