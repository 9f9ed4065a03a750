{{/*
Names, labels and metadata. Object names, label keys and annotation keys match the upstream chart:
the controller reads the cleanup annotations and the version label, and users' tooling selects on
the labels.

Helpers that compute structured data write it into an "out" dict passed by the caller instead of
returning YAML text, so values keep their types (a label "123" stays a string).
*/}}

{{/* The scale set name: runnerScaleSetName, else the release name. Drives every object name. */}}
{{- define "gha-rs.scaleSetName" -}}
{{- default .Release.Name .Values.runnerScaleSetName | toString }}
{{- end }}

{{- define "gha-rs.fullname" -}}
{{- printf "%s-gha-rs" (include "gha-rs.scaleSetName" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object names may not contain "_"; the upstream chart replaces it in some names only, kept as is. */}}
{{- define "gha-rs.fullnameDashed" -}}
{{- include "gha-rs.fullname" . | replace "_" "-" }}
{{- end }}

{{/*
The effective namespace. toString: `--set namespaceOverride=2024` arrives as a number, and a namespace name is
always a string; every use site quotes it so YAML cannot read it back as a number either.
*/}}
{{- define "gha-rs.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | toString }}
{{- end }}

{{- define "gha-rs.chart" -}}
{{- printf "gha-rs-%s" .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gha-rs.autoscalingRunnerSetName" -}}
{{- include "gha-rs.scaleSetName" . | replace "_" "-" }}
{{- end }}

{{- define "gha-rs.githubSecretName" -}}
{{- if kindIs "string" .Values.githubConfigSecret }}
{{- .Values.githubConfigSecret }}
{{- else }}
{{- include "gha-rs.fullnameDashed" . }}-github-secret
{{- end }}
{{- end }}

{{- define "gha-rs.noPermissionServiceAccountName" -}}
{{- include "gha-rs.fullnameDashed" . }}-no-permission
{{- end }}

{{- define "gha-rs.kubeModeServiceAccountName" -}}
{{- include "gha-rs.fullnameDashed" . }}-kube-mode
{{- end }}

{{- define "gha-rs.kubeModeRoleName" -}}
{{- include "gha-rs.fullname" . }}-kube-mode
{{- end }}

{{- define "gha-rs.managerRoleName" -}}
{{- include "gha-rs.fullname" . }}-manager
{{- end }}

{{/* "dind", "kubernetes", "kubernetes-novolume", or "" for any other value (upstream ignores unknown types). */}}
{{- define "gha-rs.containerMode" -}}
{{- $type := "" }}
{{- with .Values.containerMode }}{{ $type = .type | default "" | toString }}{{ end }}
{{- if has $type (list "dind" "kubernetes" "kubernetes-novolume") }}{{ $type }}{{ end }}
{{- end }}

{{- define "gha-rs.isKubeMode" -}}
{{- if has (include "gha-rs.containerMode" .) (list "kubernetes" "kubernetes-novolume") }}1{{ end }}
{{- end }}

{{/* The runner pod's ServiceAccount when the user names one in the template. */}}
{{- define "gha-rs.userServiceAccountName" -}}
{{- with .Values.template }}{{ with .spec }}{{ .serviceAccountName | default "" }}{{ end }}{{ end }}
{{- end }}

{{- define "gha-rs.runnerServiceAccountName" -}}
{{- if include "gha-rs.userServiceAccountName" . }}
{{- include "gha-rs.userServiceAccountName" . }}
{{- else if include "gha-rs.isKubeMode" . }}
{{- include "gha-rs.kubeModeServiceAccountName" . }}
{{- else }}
{{- include "gha-rs.noPermissionServiceAccountName" . }}
{{- end }}
{{- end }}

{{/* Common labels; values are quoted so a numeric scale set name stays a string. */}}
{{- define "gha-rs.commonLabels" -}}
helm.sh/chart: {{ include "gha-rs.chart" . | quote }}
app.kubernetes.io/name: {{ include "gha-rs.scaleSetName" . | quote }}
app.kubernetes.io/instance: {{ include "gha-rs.scaleSetName" . | quote }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/part-of: "gha-rs"
actions.github.com/scale-set-name: {{ include "gha-rs.scaleSetName" . | quote }}
actions.github.com/scale-set-namespace: {{ include "gha-rs.namespace" . | quote }}
{{- end }}

{{/*
metadata.labels and metadata.annotations of an object rendered by this chart.
Arguments: root, resource (key under resourceMeta), component (optional), filterAnnotations
(the AutoscalingRunnerSet drops user annotations that would collide with the controller's own).
User labels never override the chart's labels; upstream emitted duplicate keys for resourceMeta
labels, which is invalid YAML, so they are filtered like the global ones.
*/}}
{{- define "gha-rs.metadata" -}}
{{- $root := .root }}
{{- $common := include "gha-rs.commonLabels" $root | fromYaml }}
{{- $resourceMeta := $root.Values.resourceMeta | default dict }}
{{- $objectMeta := get $resourceMeta .resource | default dict }}
{{- $labels := dict }}
{{- range $source := list ($root.Values.labels | default dict) ($objectMeta.labels | default dict) }}
{{- range $key, $value := $source }}
{{- if not (or (hasKey $common $key) (eq $key "app.kubernetes.io/component") (hasPrefix "actions.github.com/" $key)) }}
{{- $_ := set $labels $key (toString $value) }}
{{- end }}
{{- end }}
{{- end }}
{{- with .component }}
{{- $_ := set $labels "app.kubernetes.io/component" . }}
{{- end }}
{{- range $key, $value := $common }}
{{- $_ := set $labels $key $value }}
{{- end }}
{{- $annotations := dict }}
{{- $filter := .filterAnnotations }}
{{- range $source := list ($root.Values.annotations | default dict) ($objectMeta.annotations | default dict) }}
{{- range $key, $value := $source }}
{{- if not (and $filter (or (hasPrefix "actions.github.com/cleanup-" $key) (eq $key "actions.github.com/values-hash"))) }}
{{- $_ := set $annotations $key (toString $value) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $key, $value := (.extraAnnotations | default dict) }}
{{- $_ := set $annotations $key $value }}
{{- end }}
{{- $metadata := dict "labels" $labels }}
{{- with $annotations }}{{ $_ := set $metadata "annotations" . }}{{ end }}
{{- toYaml $metadata }}
{{- end }}

{{/*
The controller's ServiceAccount name or namespace ("field"), the subject of the manager
RoleBinding. Explicit values win; otherwise the controller Deployment is found by its labels
(only possible against a cluster, so `helm template` needs the explicit values).
*/}}
{{- define "gha-rs.controllerServiceAccount" -}}
{{- $root := .root }}
{{- $field := .field }}
{{- $explicit := "" }}
{{- with $root.Values.controllerServiceAccount }}{{ $explicit = get . $field | default "" | toString }}{{ end }}
{{- if $explicit }}
{{- $explicit }}
{{- else }}
{{- $hint := printf "Consider setting controllerServiceAccount.%s in values.yaml to be explicit if you think the discovery is wrong." $field }}
{{- $watchLabel := "actions.github.com/controller-watch-single-namespace" }}
{{- $multi := list }}
{{- $single := list }}
{{- $found := lookup "apps/v1" "Deployment" "" "" | default dict }}
{{- range ($found.items | default list) }}
{{- $labels := .metadata.labels }}
{{- if and (kindIs "map" $labels) (eq (get $labels "app.kubernetes.io/part-of" | toString) "gha-rs-controller") }}
{{- if hasKey $labels $watchLabel }}
{{- $single = append $single $labels }}
{{- else }}
{{- $multi = append $multi $labels }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (empty $multi) (empty $single) }}
{{- fail (printf "No gha-rs-controller deployment found using label (app.kubernetes.io/part-of=gha-rs-controller). %s" $hint) }}
{{- end }}
{{- if and $multi $single }}
{{- fail (printf "Found both gha-rs-controller installed with flags.watchSingleNamespace set and unset in cluster, this is not supported. %s" $hint) }}
{{- end }}
{{- if gt (len $multi) 1 }}
{{- fail (printf "More than one gha-rs-controller deployment found using label (app.kubernetes.io/part-of=gha-rs-controller). %s" $hint) }}
{{- end }}
{{- $chosen := dict }}
{{- if $multi }}
{{- $chosen = first $multi }}
{{- else }}
{{- $namespace := include "gha-rs.namespace" $root }}
{{- range $single }}
{{- if eq (get . $watchLabel | toString) $namespace }}{{ $chosen = . }}{{ end }}
{{- end }}
{{- if empty $chosen }}
{{- fail (printf "No gha-rs-controller deployment that watch this namespace found using label (%s). %s" $watchLabel $hint) }}
{{- end }}
{{- end }}
{{- $labelKey := printf "actions.github.com/controller-service-account-%s" $field }}
{{- $value := get $chosen $labelKey | toString }}
{{- if not $value }}
{{- fail (printf "No service account name found for gha-rs-controller deployment using label (%s), consider setting controllerServiceAccount.%s in values.yaml to be explicit if you think the discovery is wrong." $labelKey $field) }}
{{- end }}
{{- $value }}
{{- end }}
{{- end }}

{{/*
Merges two lists of named items (env vars, volume mounts): every item of "first", then the items
of "second" whose name "first" does not use. Result in out.result.
*/}}
{{- define "gha-rs.mergeByName" -}}
{{- $names := list }}
{{- $result := list }}
{{- range (.first | default list) }}
{{- $result = append $result . }}
{{- $names = append $names (toString .name) }}
{{- end }}
{{- range (.second | default list) }}
{{- if not (has (toString .name) $names) }}
{{- $result = append $result . }}
{{- end }}
{{- end }}
{{- $_ := set .out "result" $result }}
{{- end }}

{{/*
Overlays a user container ("override") on a chart container ("base"): every field the user sets
wins, except that env and volumeMounts keep the chart's entries the user does not name. Unset
(null) user fields keep the chart's value. Result in out.result.
*/}}
{{- define "gha-rs.mergeContainer" -}}
{{- $result := deepCopy .base }}
{{- range $key, $value := (.override | default dict) }}
{{- if and (ne $key "name") (not (kindIs "invalid" $value)) }}
{{- if has $key (list "env" "volumeMounts") }}
{{- $merged := dict }}
{{- $_ := include "gha-rs.mergeByName" (dict "first" $value "second" (get $result $key) "out" $merged) }}
{{- $_ := set $result $key $merged.result }}
{{- else }}
{{- $_ := set $result $key $value }}
{{- end }}
{{- end }}
{{- end }}
{{- $_ := set .out "result" $result }}
{{- end }}

{{/*
Volumes: each chart volume in order, replaced by the user's volume of the same name when there is
one, then the remaining user volumes in order. Result in out.result.
*/}}
{{- define "gha-rs.mergeVolumes" -}}
{{- $user := .user | default list }}
{{- $chartNames := list }}
{{- $result := list }}
{{- range $volume := (.chart | default list) }}
{{- $chartNames = append $chartNames $volume.name }}
{{- $replacement := dict }}
{{- range $user }}
{{- if and (empty $replacement) (eq (toString .name) $volume.name) }}{{ $replacement = . }}{{ end }}
{{- end }}
{{- $result = append $result (empty $replacement | ternary $volume $replacement) }}
{{- end }}
{{- range $user }}
{{- if not (has (toString .name) $chartNames) }}
{{- $result = append $result . }}
{{- end }}
{{- end }}
{{- $_ := set .out "result" $result }}
{{- end }}

{{/* The first item of .list whose name is .name, or an empty dict. Result in out.result. */}}
{{- define "gha-rs.findByName" -}}
{{- $found := dict }}
{{- range (.list | default list) }}
{{- if and (empty $found) (eq (toString .name) $.name) }}{{ $found = . }}{{ end }}
{{- end }}
{{- $_ := set .out "result" $found }}
{{- end }}
