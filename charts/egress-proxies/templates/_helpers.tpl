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

{{- define "ep.image" -}}
{{- $img := merge (default dict .svc.image) .root.Values.image -}}
{{ $img.repository }}-{{ .component }}:{{ default .root.Chart.AppVersion $img.tag }}
{{- end }}

{{/* Restricted pod security, the same for every pod. */}}
{{- define "ep.podSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile: {type: RuntimeDefault}
{{- end }}

{{- define "ep.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
{{- end }}

{{- define "ep.redisAddrs" -}}
{{- if .Values.redis.internal.enabled -}}{{ include "ep.name" . }}-redis:6379{{- else -}}{{ required "redis.external.addrs is required when redis.internal.enabled is false" .Values.redis.external.addrs }}{{- end -}}
{{- end }}

{{/* The probe stream's TLS Secret: the user's own when source is "existing". */}}
{{- define "ep.probeTLSSecret" -}}
{{- if eq .Values.auth.probeTLS.source "existing" -}}
{{ .Values.auth.probeTLS.secretName }}
{{- else -}}
{{ include "ep.name" . }}-{{ .Values.auth.probeTLS.secretName }}
{{- end -}}
{{- end }}
