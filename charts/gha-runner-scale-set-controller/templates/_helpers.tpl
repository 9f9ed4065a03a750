{{/*
Naming, labels and the ServiceAccount name. Names and label keys match the upstream chart because
the gha-runner-scale-set chart and existing tooling find the controller through them.
*/}}

{{- define "gha-runner-scale-set-controller.name" -}}
{{- default "gha-rs-controller" .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: fullnameOverride, else the release name when it already contains the base name, else
"<release>-<name>". Truncated to 63 characters because it becomes object names and label values.
*/}}
{{- define "gha-runner-scale-set-controller.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default "gha-rs-controller" .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gha-runner-scale-set-controller.chart" -}}
{{- printf "%s-%s" "gha-rs-controller" .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The effective namespace. toString: `--set namespaceOverride=2024` arrives as a number, and a namespace
name is always a string; every use site quotes it so YAML cannot read it back as a number either.
*/}}
{{- define "gha-runner-scale-set-controller.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | toString }}
{{- end }}

{{- define "gha-runner-scale-set-controller.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gha-runner-scale-set-controller.name" . }}
app.kubernetes.io/namespace: {{ include "gha-runner-scale-set-controller.namespace" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gha-runner-scale-set-controller.labels" -}}
helm.sh/chart: {{ include "gha-runner-scale-set-controller.chart" . }}
{{ include "gha-runner-scale-set-controller.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/part-of: gha-rs-controller
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- range $k, $v := .Values.labels }}
{{ $k | quote }}: {{ $v | toString | quote }}
{{- end }}
{{- end }}

{{/*
The ServiceAccount the manager runs as; every binding's subject uses it too, so the checks fail
whichever template renders first.
*/}}
{{- define "gha-runner-scale-set-controller.serviceAccountName" -}}
{{- if eq (toString .Values.serviceAccount.name) "default" }}
{{- fail "serviceAccount.name cannot be set to 'default'" }}
{{- end }}
{{- if .Values.serviceAccount.create }}
{{- default (include "gha-runner-scale-set-controller.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- if not .Values.serviceAccount.name }}
{{- fail "serviceAccount.name must be set if serviceAccount.create is false" }}
{{- end }}
{{- .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The watched namespace, or "" for cluster-wide mode. `--set flags.watchSingleNamespace=...` types its value, so a
namespace named "2024" or "true" arrives as a number or a boolean; ARC's chart accepts those, and so does this
one: the value is used as text (false and 0 mean unset, as in ARC's `if`).
*/}}
{{- define "gha-runner-scale-set-controller.watchSingleNamespace" -}}
{{- with .Values.flags }}{{ .watchSingleNamespace | default "" | toString }}{{ end }}
{{- end }}

{{- define "gha-runner-scale-set-controller.replicaCount" -}}
{{- int (default 1 .Values.replicaCount) }}
{{- end }}

{{/* "1" when leader election is on: only meaningful with more than one replica. */}}
{{- define "gha-runner-scale-set-controller.leaderElection" -}}
{{- if gt (int (include "gha-runner-scale-set-controller.replicaCount" .)) 1 }}1{{ end }}
{{- end }}

{{- define "gha-runner-scale-set-controller.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}

{{/*
The port of a bind address such as ":8080" or "0.0.0.0:8080"; fails with the given message when the
address does not end in digits, because a container port cannot be derived from it.
*/}}
{{- define "gha-runner-scale-set-controller.port" -}}
{{- $port := regexFind "[0-9]+$" (toString .addr) }}
{{- if not $port }}
{{- fail .message }}
{{- end }}
{{- $port }}
{{- end }}

{{/* The binding subject shared by every (Cluster)RoleBinding of this chart. */}}
{{- define "gha-runner-scale-set-controller.subjects" -}}
subjects:
  - kind: ServiceAccount
    name: {{ include "gha-runner-scale-set-controller.serviceAccountName" . }}
    namespace: {{ include "gha-runner-scale-set-controller.namespace" . | quote }}
{{- end }}
