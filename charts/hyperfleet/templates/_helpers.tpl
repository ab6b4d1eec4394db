{{/* The chart's name, or nameOverride. */}}
{{- define "hyperfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every object's name: fullnameOverride, else the release name if
it contains the chart's name, else <release>-<chart>. Kept to 40 characters so
that the longest suffix (-metrics-reader, -github-webhook) still fits in 63.
*/}}
{{- define "hyperfleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := include "hyperfleet.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "hyperfleet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "hyperfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels of the manager's objects (Deployment, Services, ...). */}}
{{- define "hyperfleet.managerLabels" -}}
{{ include "hyperfleet.labels" . }}
app.kubernetes.io/component: manager
{{- end }}

{{/* Labels that select the manager's pods. */}}
{{- define "hyperfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hyperfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: manager
{{- end }}

{{/* The manager's ServiceAccount. */}}
{{- define "hyperfleet.serviceAccountName" -}}
{{- if and (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) }}
{{- fail "serviceAccount.name: set the name of an existing ServiceAccount when serviceAccount.create is false" }}
{{- end }}
{{- default (printf "%s-manager" (include "hyperfleet.fullname" .)) .Values.serviceAccount.name }}
{{- end }}

{{/* The operator's image: repository, then the digest or the tag. */}}
{{- define "hyperfleet.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Secrets of the receiver's and the agent server's certificates. */}}
{{/* The Secret of the metrics server's certificate; empty when the manager
makes a self-signed one (neither metrics.tls.secretName nor
metrics.certificate.enabled, or metrics.secure off). */}}
{{- define "hyperfleet.metricsTLSSecret" -}}
{{- if .Values.metrics.secure }}
{{- if .Values.metrics.tls.secretName }}
{{- .Values.metrics.tls.secretName }}
{{- else if .Values.metrics.certificate.enabled }}
{{- printf "%s-metrics-tls" (include "hyperfleet.fullname" .) }}
{{- end }}
{{- end }}
{{- end }}

{{- /*
The TLS settings of a scrape of the manager's metrics (a ServiceMonitor's
endpoint or a PodMonitor's): the values' tlsConfig, the server name
defaulting to the metrics Service's name (the name the certificate is for,
also when a PodMonitor scrapes the pod by its address) and the CA to the
ca.crt of the metrics certificate's Secret, unless tlsConfig names one.
Called with (dict "root" $ "tlsConfig" <values' tlsConfig>).
*/ -}}
{{- define "hyperfleet.metricsScrapeTLS" -}}
{{- $root := .root }}
{{- $fullname := include "hyperfleet.fullname" $root }}
{{- $tls := merge (deepCopy (default (dict) .tlsConfig)) (dict "serverName" (printf "%s-metrics.%s.svc" $fullname $root.Release.Namespace)) }}
{{- $secret := include "hyperfleet.metricsTLSSecret" $root }}
{{- if and $secret (not (hasKey $tls "ca")) }}
{{- $_ := set $tls "ca" (dict "secret" (dict "name" $secret "key" "ca.crt")) }}
{{- end }}
{{- $tls | toYaml }}
{{- end }}

{{- define "hyperfleet.webhookTLSSecret" -}}
{{- default (printf "%s-webhook-tls" (include "hyperfleet.fullname" .)) .Values.webhook.tls.secretName }}
{{- end }}
{{- define "hyperfleet.agentTLSSecret" -}}
{{- default (printf "%s-agent-tls" (include "hyperfleet.fullname" .)) .Values.agentServer.tls.secretName }}
{{- end }}

{{/* The ConfigMap of the CA certificates trusted besides the image's. */}}
{{- define "hyperfleet.trustedCAConfigMap" -}}
{{- default (printf "%s-trusted-ca" (include "hyperfleet.fullname" .)) .Values.trustedCA.configMapName }}
{{- end }}

{{/*
The namespaces whose Secrets the manager reads, as --secret-namespaces takes
them: the release's first, then secretNamespaces' without repeats, joined
by commas; "*" when secretNamespaces is ["*"] (every namespace).
*/}}
{{- define "hyperfleet.secretNamespaces" -}}
{{- $list := .Values.secretNamespaces | default list }}
{{- if has "*" $list }}
{{- if gt (len $list) 1 }}
{{- fail (printf "secretNamespaces is %v: \"*\" means every namespace, so list nothing else with it" $list) }}
{{- end }}
{{- print "*" }}
{{- else }}
{{- prepend $list .Release.Namespace | uniq | join "," }}
{{- end }}
{{- end }}

{{/* The in-cluster DNS names of a Service: pass (list $ "<suffix>"). */}}
{{- define "hyperfleet.serviceDNSNames" -}}
{{- $root := index . 0 }}
{{- $svc := printf "%s-%s" (include "hyperfleet.fullname" $root) (index . 1) }}
{{- $ns := $root.Release.Namespace }}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson }}
{{- end }}

{{/*
The objects of a file of config/, which `make manifests` copies into
files/config, each a dict, in order: pass (list $ "rbac/role.yaml").
Templates take rules and specs from them, so that the chart installs what
config/ does. A template returns a string, so this returns JSON
{"docs": [...]}: (fromJson (include "hyperfleet.configDocs" ...)).docs.
*/}}
{{- define "hyperfleet.configDocs" -}}
{{- $root := index . 0 }}
{{- $path := printf "files/config/%s" (index . 1) }}
{{- $raw := $root.Files.Get $path }}
{{- if not $raw }}
{{- fail (printf "%s is missing from the chart: run make manifests" $path) }}
{{- end }}
{{- $docs := list }}
{{- range $doc := regexSplit "(?m)^---[ \t]*$" $raw -1 }}
{{- $obj := fromYaml $doc }}
{{- if hasKey $obj "Error" }}
{{- fail (printf "%s: %s" $path $obj.Error) }}
{{- end }}
{{- if $obj }}
{{- $docs = append $docs $obj }}
{{- end }}
{{- end }}
{{- dict "docs" $docs | toJson }}
{{- end }}

{{/* The rules of the (only) role in a file of config/: pass (list $ "rbac/role.yaml"). */}}
{{- define "hyperfleet.configRules" -}}
{{- (index (fromJson (include "hyperfleet.configDocs" .)).docs 0).rules | toYaml }}
{{- end }}
