{{/*
RBAC rule blocks shared by the cluster-wide ClusterRole and the two single-namespace Roles, so the
two modes cannot drift apart. Order within each block follows the upstream chart.
*/}}

{{- define "gha-runner-scale-set-controller.rules.full" -}}
["create", "delete", "get", "list", "patch", "update", "watch"]
{{- end }}

{{- define "gha-runner-scale-set-controller.rules.autoscalingRunnerSets" -}}
- apiGroups: ["actions.github.com"]
  resources: ["autoscalingrunnersets"]
  verbs: {{ include "gha-runner-scale-set-controller.rules.full" . }}
- apiGroups: ["actions.github.com"]
  resources: ["autoscalingrunnersets/finalizers"]
  verbs: ["patch", "update"]
- apiGroups: ["actions.github.com"]
  resources: ["autoscalingrunnersets/status"]
  verbs: ["get", "patch", "update"]
{{- end }}

{{- define "gha-runner-scale-set-controller.rules.autoscalingListeners" -}}
- apiGroups: ["actions.github.com"]
  resources: ["autoscalinglisteners"]
  verbs: {{ include "gha-runner-scale-set-controller.rules.full" . }}
- apiGroups: ["actions.github.com"]
  resources: ["autoscalinglisteners/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["actions.github.com"]
  resources: ["autoscalinglisteners/finalizers"]
  verbs: ["patch", "update"]
{{- end }}

{{- define "gha-runner-scale-set-controller.rules.runnersAndSets" -}}
- apiGroups: ["actions.github.com"]
  resources: ["ephemeralrunnersets"]
  verbs: {{ include "gha-runner-scale-set-controller.rules.full" . }}
- apiGroups: ["actions.github.com"]
  resources: ["ephemeralrunnersets/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["actions.github.com"]
  resources: ["ephemeralrunnersets/finalizers"]
  verbs: ["patch", "update"]
- apiGroups: ["actions.github.com"]
  resources: ["ephemeralrunners"]
  verbs: {{ include "gha-runner-scale-set-controller.rules.full" . }}
- apiGroups: ["actions.github.com"]
  resources: ["ephemeralrunners/finalizers"]
  verbs: ["patch", "update"]
- apiGroups: ["actions.github.com"]
  resources: ["ephemeralrunners/status"]
  verbs: ["get", "patch", "update"]
{{- end }}

{{/*
Objects the controller only watches. Roles may also be patched where the scale sets live (the
listener Roles are there); the controller-namespace Role of single-namespace mode leaves them read-only.
*/}}
{{- define "gha-runner-scale-set-controller.rules.watchedCore" -}}
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["list", "watch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["rolebindings"]
  verbs: ["list", "watch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles"]
  verbs: {{ if .patchRoles }}["list", "watch", "patch"]{{ else }}["list", "watch"]{{ end }}
{{- end }}

{{/*
Beyond upstream: the controller reports why a scale set cannot make progress as Events on the
objects it reconciles, which needs Event create/patch where those objects live (both API groups,
as clients may use either Events API).
*/}}
{{- define "gha-runner-scale-set-controller.rules.events" -}}
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}
