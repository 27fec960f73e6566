{{- define "ep.name" -}}{{ .Release.Name | trunc 40 | trimSuffix "-" }}{{- end }}

{{- define "ep.labels" -}}
app.kubernetes.io/name: egress-proxies
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{- define "ep.selector" -}}
app.kubernetes.io/name: egress-proxies
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
A component's image: registry (global.imageRegistry, then the component's,
then image.registry), the component's repository exactly as given, and its
digest if set, else its tag (then image.tag, then the appVersion).
Takes the usual (dict "root" "component" "svc").
*/}}
{{- define "ep.image" -}}
{{- $g := .root.Values.global | default dict -}}
{{- $i := .svc.image | default dict -}}
{{- $reg := coalesce $g.imageRegistry $i.registry .root.Values.image.registry -}}
{{- $repo := required (printf "%s.image.repository is required" .component) $i.repository -}}
{{- if $reg }}{{ $repo = printf "%s/%s" (trimSuffix "/" $reg) $repo }}{{ end -}}
{{- if $i.digest -}}
{{ $repo }}@{{ $i.digest }}
{{- else -}}
{{ $repo }}:{{ coalesce $i.tag .root.Values.image.tag .root.Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/*
The pod template's metadata: the selector labels plus podLabels, and
podAnnotations plus any the template passes in "annotations".
*/}}
{{- define "ep.podMetadata" -}}
labels:
  {{- include "ep.selector" . | nindent 2 }}
  {{- with .svc.podLabels }}{{ toYaml . | nindent 2 }}{{ end }}
{{- $ann := merge (dict) (.annotations | default dict) (.svc.podAnnotations | default dict) }}
{{- with $ann }}
annotations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The pod spec fields every component takes from its values the same way:
pull secrets (global's and its own), scheduling, priority and the pod
security context (its own, else the chart's podSecurityContext).
*/}}
{{- define "ep.podScheduling" -}}
{{- $g := .root.Values.global | default dict -}}
{{- with concat ($g.imagePullSecrets | default list) (.svc.imagePullSecrets | default list) }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .svc.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .svc.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .svc.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .svc.topologySpreadConstraints }}
topologySpreadConstraints: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .svc.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with (.svc.podSecurityContext | default .root.Values.podSecurityContext) }}
securityContext: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The container fields every component takes from its values. */}}
{{- define "ep.containerCommon" -}}
image: {{ include "ep.image" . }}
imagePullPolicy: {{ coalesce (.svc.image | default dict).pullPolicy .root.Values.image.pullPolicy }}
{{- with (.svc.securityContext | default .root.Values.containerSecurityContext) }}
securityContext: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .svc.resources }}
resources: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A component's ServiceAccount, with the annotations it is given (GKE Workload Identity). */}}
{{- define "ep.serviceAccount" -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "ep.name" .root }}-{{ .component }}
  namespace: {{ .root.Release.Namespace }}
  labels: {{- include "ep.labels" .root | nindent 4 }}
  {{- with (.svc.serviceAccount | default dict).annotations }}
  annotations: {{- toYaml . | nindent 4 }}
  {{- end }}
{{- if .noToken }}
automountServiceAccountToken: false
{{- end }}
{{- end }}

{{- define "ep.redisAddrs" -}}
{{- if .Values.redis.internal.enabled -}}{{ include "ep.name" . }}-redis:6379{{- else -}}{{ required "redis.external.addrs is required when redis.internal.enabled is false" .Values.redis.external.addrs }}{{- end -}}
{{- end }}

{{/* The Secret holding the Redis password (key `password`), or nothing. */}}
{{- define "ep.redisPasswordSecret" -}}
{{- if .Values.redis.internal.enabled -}}
{{- if .Values.redis.internal.auth.enabled }}{{ include "ep.secretName" (dict "root" . "cfg" .Values.redis.internal.auth) }}{{ end -}}
{{- else -}}
{{ .Values.redis.external.passwordSecret }}
{{- end -}}
{{- end }}

{{/*
The name of a Secret the chart makes unless told it exists, one rule for
all of them: with create, <release>-<secretName>; without, secretName as
given (a Secret you, or `make deploy`, made). (dict "root" "cfg").
*/}}
{{- define "ep.secretName" -}}
{{- if .cfg.create }}{{ include "ep.name" .root }}-{{ .cfg.secretName }}{{ else }}{{ .cfg.secretName }}{{ end -}}
{{- end }}

{{/*
A Secret the chart generates once and keeps across upgrades by lookup:
(dict "root" "name" "key" "length").
*/}}
{{- define "ep.generatedSecret" -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .name -}}
apiVersion: v1
kind: Secret
metadata:
  name: {{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels: {{- include "ep.labels" .root | nindent 4 }}
type: Opaque
data:
  # Generated once; kept across upgrades.
  {{ .key }}: {{ if and $existing (hasKey $existing.data .key) }}{{ index $existing.data .key }}{{ else }}{{ randAlphaNum (int .length) | b64enc }}{{ end }}
{{- end }}

{{/* The discovery token's Secret name, or empty when the lease API is unauthenticated. */}}
{{- define "ep.discoveryTokenSecret" -}}
{{- if .Values.auth.discoveryToken.enabled -}}
{{ include "ep.secretName" (dict "root" . "cfg" .Values.auth.discoveryToken) }}
{{- end -}}
{{- end }}

{{/* The gateway token's Secret name, or empty when there is none: the
gateway-only credential crawlers put in their proxy URLs. */}}
{{- define "ep.gatewayTokenSecret" -}}
{{- if and .Values.auth.discoveryToken.enabled .Values.auth.gatewayToken.enabled .Values.broker.gateway.enabled -}}
{{ include "ep.secretName" (dict "root" . "cfg" .Values.auth.gatewayToken) }}
{{- end -}}
{{- end }}

{{/* The proxy credentials key's Secret name, or empty when Managed proxies are open. */}}
{{- define "ep.credentialsKeySecret" -}}
{{- if .Values.auth.proxyCredentials.enabled -}}
{{ include "ep.secretName" (dict "root" . "cfg" .Values.auth.proxyCredentials) }}
{{- end -}}
{{- end }}

{{/* The probe stream's TLS Secret: the user's own when source is "existing". */}}
{{- define "ep.probeTLSSecret" -}}
{{- if eq .Values.auth.probeTLS.source "existing" -}}
{{ .Values.auth.probeTLS.secretName }}
{{- else -}}
{{ include "ep.name" . }}-{{ .Values.auth.probeTLS.secretName }}
{{- end -}}
{{- end }}

{{/* The broker's TLS Secret, or empty when the broker serves plaintext. */}}
{{- define "ep.brokerTLSSecret" -}}
{{- $t := .Values.broker.tls -}}
{{- if $t.enabled -}}
{{- if eq $t.source "cert-manager" }}{{ include "ep.name" . }}-broker-tls{{ else }}{{ required "broker.tls.secretName is required when broker.tls.source is existing" $t.secretName }}{{ end -}}
{{- end -}}
{{- end }}

{{/* The egress policy's flags, the same for every service enforcing it. */}}
{{- define "ep.egressArgs" -}}
- --egress-deny-cidrs={{ include "ep.egressDeny" . }}
- --egress-ports={{ .Values.egress.ports }}
- --egress-tls-ports={{ .Values.egress.tlsPorts }}
{{- with .Values.egress.allowanceCIDRs }}
- --egress-allowance-cidrs={{ . }}
{{- end }}
{{- end }}

{{- define "ep.egressDeny" -}}
{{ .Values.egress.denyCIDRs }}{{ with .Values.egress.clusterCIDRs }},{{ . }}{{ end }}
{{- end }}

{{/* Where Secrets are read: the release's namespace, then secretNamespaces. */}}
{{- define "ep.secretNamespaces" -}}
{{ join "," (uniq (prepend .Values.secretNamespaces .Release.Namespace)) }}
{{- end }}
