{{/* Names and labels. */}}
{{- define "gpufleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpufleet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "web"). */}}
{{- define "gpufleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpufleet.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpufleet.labels" -}}
{{ include "gpufleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gpufleet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "gpufleet.webServiceName" -}}
{{ include "gpufleet.fullname" . }}-web
{{- end -}}

{{/* The server URL agents inside the cluster push to: the web Service (ingest is exempt from
the HTTPS redirect, config/settings/production.py). */}}
{{- define "gpufleet.inClusterServer" -}}
http://{{ include "gpufleet.webServiceName" . }}.{{ .Release.Namespace }}.svc:{{ .Values.web.service.port }}
{{- end -}}

{{- define "gpufleet.secretsDir" -}}/var/run/secrets/gpufleet{{- end -}}

{{/* Every secret the server reads, as (env name, secret, key): the three URLs and keys, then
secrets.extra. One list for the projected volume and the NAME_FILE variables. */}}
{{- define "gpufleet.secretRefs" -}}
{{- $refs := list
  (dict "env" "DATABASE_URL" "name" .Values.secrets.databaseUrl.name "key" .Values.secrets.databaseUrl.key)
  (dict "env" "REDIS_URL" "name" .Values.secrets.redisUrl.name "key" .Values.secrets.redisUrl.key)
  (dict "env" "SECRET_KEY" "name" .Values.secrets.secretKey.name "key" .Values.secrets.secretKey.key) -}}
{{- range .Values.secrets.extra -}}
{{- $refs = append $refs (dict "env" .env "name" .name "key" .key) -}}
{{- end -}}
{{- toJson $refs -}}
{{- end -}}

{{/* The settings of web, worker, beat and the migration Job: the ConfigMap's data, and the
Job's env (a pre-install hook runs before the ConfigMap exists). */}}
{{- define "gpufleet.configData" -}}
{{- $hosts := list "localhost" "127.0.0.1" -}}
{{- $svc := include "gpufleet.webServiceName" . -}}
{{- $hosts = concat $hosts (list $svc (printf "%s.%s" $svc .Release.Namespace) (printf "%s.%s.svc" $svc .Release.Namespace)) -}}
{{- if and .Values.ingress.enabled .Values.ingress.host -}}
{{- $hosts = append $hosts .Values.ingress.host -}}
{{- end -}}
{{- $hosts = concat $hosts .Values.allowedHosts | uniq -}}
{{- $data := dict
  "DJANGO_SETTINGS_MODULE" "config.settings.production"
  "ALLOWED_HOSTS" (join "," $hosts)
  "WEB_CONCURRENCY" (toString .Values.web.concurrency) -}}
{{- if and .Values.ingress.enabled .Values.ingress.host -}}
{{- $_ := set $data "SITE_URL" (printf "https://%s" .Values.ingress.host) -}}
{{- end -}}
{{- range (include "gpufleet.secretRefs" . | fromJsonArray) -}}
{{- $_ := set $data (printf "%s_FILE" .env) (printf "%s/%s" (include "gpufleet.secretsDir" $) .env) -}}
{{- end -}}
{{- range $name, $value := .Values.config -}}
{{- $_ := set $data $name $value -}}
{{- end -}}
{{- toYaml $data -}}
{{- end -}}

{{/* The pod security context of web, worker, beat and the Job: the image's own user. */}}
{{- define "gpufleet.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gpufleet.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* Volumes of the server's pods: the secrets as files, and the only places they write
(/tmp; HOME for Chromium, which renders the weekly email's charts). */}}
{{- define "gpufleet.appVolumes" -}}
{{- $itemsBySecret := dict -}}
{{- range (include "gpufleet.secretRefs" . | fromJsonArray) -}}
{{- $items := get $itemsBySecret .name | default list -}}
{{- $_ := set $itemsBySecret .name (append $items (dict "key" .key "path" .env)) -}}
{{- end -}}
- name: secrets
  projected:
    defaultMode: 0440
    sources:
      {{- range $name, $items := $itemsBySecret }}
      - secret:
          name: {{ $name }}
          items:
            {{- toYaml $items | nindent 12 }}
      {{- end }}
- name: tmp
  emptyDir: {}
- name: home
  emptyDir: {}
{{- end -}}

{{- define "gpufleet.appVolumeMounts" -}}
- name: secrets
  mountPath: {{ include "gpufleet.secretsDir" . }}
  readOnly: true
- name: tmp
  mountPath: /tmp
- name: home
  mountPath: /home/gpufleet
{{- end -}}

{{/* Pod-level settings every server pod shares. */}}
{{- define "gpufleet.appPodSpec" -}}
automountServiceAccountToken: false
securityContext:
  {{- include "gpufleet.podSecurityContext" . | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Scheduling of one component (its nodeSelector and tolerations), empty when it has none. */}}
{{- define "gpufleet.scheduling" -}}
{{- $scheduling := dict -}}
{{- with .nodeSelector }}{{ $_ := set $scheduling "nodeSelector" . }}{{ end -}}
{{- with .tolerations }}{{ $_ := set $scheduling "tolerations" . }}{{ end -}}
{{- with $scheduling }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{- define "gpufleet.configChecksum" -}}
checksum/config: {{ include "gpufleet.configData" . | sha256sum }}
{{- end -}}
