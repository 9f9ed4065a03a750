{{/*
The runner pod template (AutoscalingRunnerSet spec.template) for the selected container mode.

Where this differs from upstream, it is because upstream renders a pod that cannot run:
- Helm replaces lists wholesale, so a user "runner" container that sets only resources lost the
  image and command (ARC issues #4125, #3572). A runner container without an image keeps the
  default image and command; one that names its own image is taken as given.
- Without any "runner" container the controller can never start a runner, so the default one is
  added.
- In dind mode the user's "dind" container (in containers or initContainers) was dropped; it is
  now merged into the chart's dind container by name, so its image, resources or args can be set.
- A user volume with the name of a chart volume replaces it instead of duplicating the name.
*/}}

{{- define "gha-rs.defaultRunnerImage" -}}ghcr.io/actions/actions-runner:latest{{- end }}

{{- define "gha-rs.dindSidecarSupported" -}}
{{- /* Native sidecars (restartable init containers) are on by default from Kubernetes 1.29. The
  full version is compared because managed clusters report minors such as "29+", which upstream
  read as 0. */}}
{{- if semverCompare ">=1.29.0-0" .Capabilities.KubeVersion.Version }}1{{ end }}
{{- end }}

{{- define "gha-rs.runnerPodTemplate" -}}
{{- $root := .root }}
{{- $out := .out }}
{{- $values := $root.Values }}
{{- $template := $values.template | default dict }}
{{- $userSpec := $template.spec | default dict }}
{{- $mode := include "gha-rs.containerMode" $root }}

{{- /* metadata: only labels and annotations are meaningful for the runner pods. */}}
{{- $metadata := dict }}
{{- $templateMetadata := $template.metadata | default dict }}
{{- range $field := list "labels" "annotations" }}
{{- $entries := dict }}
{{- range $key, $value := (get $templateMetadata $field | default dict) }}
{{- $_ := set $entries $key (toString $value) }}
{{- end }}
{{- if $entries }}{{ $_ := set $metadata $field $entries }}{{ end }}
{{- end }}

{{- /* Pod-level fields pass through; the four below are computed. */}}
{{- $spec := dict }}
{{- range $key, $value := $userSpec }}
{{- if not (has $key (list "containers" "volumes" "initContainers" "serviceAccountName")) }}
{{- $_ := set $spec $key $value }}
{{- end }}
{{- end }}
{{- if not $spec.restartPolicy }}
{{- $_ := set $spec "restartPolicy" "Never" }}
{{- end }}
{{- $_ := set $spec "serviceAccountName" (include "gha-rs.runnerServiceAccountName" $root) }}

{{- /* GitHub server CA, injected into the runner container when runnerMountPath is set. */}}
{{- $tlsEnv := list }}
{{- $tlsMounts := list }}
{{- $tlsVolumes := list }}
{{- $mountPath := "" }}
{{- $certificateRef := dict }}
{{- with $values.githubServerTLS }}
{{- $mountPath = .runnerMountPath | default "" | toString }}
{{- with .certificateFrom }}{{ with .configMapKeyRef }}{{ $certificateRef = . }}{{ end }}{{ end }}
{{- end }}
{{- if $mountPath }}
{{- if not $certificateRef.name }}
{{- fail "githubServerTLS.certificateFrom.configMapKeyRef.name is required when githubServerTLS.runnerMountPath is set" }}
{{- end }}
{{- if not $certificateRef.key }}
{{- fail "githubServerTLS.certificateFrom.configMapKeyRef.key is required when githubServerTLS.runnerMountPath is set" }}
{{- end }}
{{- $key := toString $certificateRef.key }}
{{- $certificatePath := clean (printf "%s/%s" $mountPath $key) }}
{{- $tlsEnv = list (dict "name" "NODE_EXTRA_CA_CERTS" "value" $certificatePath) (dict "name" "RUNNER_UPDATE_CA_CERTS" "value" "1") }}
{{- $tlsMounts = list (dict "name" "github-server-tls-cert" "mountPath" $certificatePath "subPath" $key) }}
{{- $tlsVolumes = list (dict "name" "github-server-tls-cert" "configMap" (dict "name" (toString $certificateRef.name) "items" (list (dict "key" $key "path" $key)))) }}
{{- end }}

{{- /* The runner container. */}}
{{- $userContainers := $userSpec.containers | default list }}
{{- $runnerCount := 0 }}
{{- range $userContainers }}{{ if eq (toString .name) "runner" }}{{ $runnerCount = add1 $runnerCount }}{{ end }}{{ end }}
{{- if gt $runnerCount 1 }}
{{- fail "template.spec.containers has more than one container named runner; the controller needs exactly one" }}
{{- end }}
{{- $found := dict }}
{{- $_ := include "gha-rs.findByName" (dict "list" $userContainers "name" "runner" "out" $found) }}
{{- $userRunner := $found.result }}
{{- $runnerBase := dict "name" "runner" }}
{{- if not $userRunner.image }}
{{- $runnerBase = dict "name" "runner" "image" (include "gha-rs.defaultRunnerImage" .) "command" (list "/home/runner/run.sh") }}
{{- end }}
{{- $merged := dict }}
{{- $_ := include "gha-rs.mergeContainer" (dict "base" $runnerBase "override" $userRunner "out" $merged) }}
{{- $runner := $merged.result }}

{{- $chartEnv := list }}
{{- $chartMounts := list }}
{{- $chartVolumes := list }}
{{- $workMount := dict "name" "work" "mountPath" "/home/runner/_work" }}
{{- if eq $mode "dind" }}
{{- $chartEnv = list (dict "name" "DOCKER_HOST" "value" "unix:///var/run/docker.sock") (dict "name" "RUNNER_WAIT_FOR_DOCKER_IN_SECONDS" "value" "120") }}
{{- $chartMounts = list $workMount (dict "name" "dind-sock" "mountPath" "/var/run") }}
{{- $chartVolumes = list (dict "name" "dind-sock" "emptyDir" dict) (dict "name" "dind-externals" "emptyDir" dict) (dict "name" "work" "emptyDir" dict) }}
{{- else if eq $mode "kubernetes" }}
{{- $chartEnv = list (dict "name" "ACTIONS_RUNNER_CONTAINER_HOOKS" "value" "/home/runner/k8s/index.js") (dict "name" "ACTIONS_RUNNER_POD_NAME" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.name"))) (dict "name" "ACTIONS_RUNNER_REQUIRE_JOB_CONTAINER" "value" "true") }}
{{- $chartMounts = list $workMount }}
{{- $claim := dict }}
{{- with $values.containerMode }}{{ $claim = .kubernetesModeWorkVolumeClaim | default dict }}{{ end }}
{{- if not $claim }}
{{- /* Upstream renders "spec: null", which the API server rejects; a small claim on the default StorageClass works. */}}
{{- $claim = dict "accessModes" (list "ReadWriteOnce") "resources" (dict "requests" (dict "storage" "1Gi")) }}
{{- end }}
{{- $chartVolumes = list (dict "name" "work" "ephemeral" (dict "volumeClaimTemplate" (dict "spec" $claim))) }}
{{- else if eq $mode "kubernetes-novolume" }}
{{- $chartEnv = list (dict "name" "ACTIONS_RUNNER_CONTAINER_HOOKS" "value" "/home/runner/k8s-novolume/index.js") (dict "name" "ACTIONS_RUNNER_POD_NAME" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.name"))) (dict "name" "ACTIONS_RUNNER_REQUIRE_JOB_CONTAINER" "value" "true") (dict "name" "ACTIONS_RUNNER_IMAGE" "value" ($runner.image | default "" | toString)) }}
{{- end }}
{{- $chartEnv = concat $chartEnv $tlsEnv }}
{{- $chartMounts = concat $chartMounts $tlsMounts }}
{{- $chartVolumes = concat $tlsVolumes $chartVolumes }}

{{- $mergedList := dict }}
{{- $_ := include "gha-rs.mergeByName" (dict "first" $runner.env "second" $chartEnv "out" $mergedList) }}
{{- if $mergedList.result }}{{ $_ := set $runner "env" $mergedList.result }}{{ else }}{{ $_ := unset $runner "env" }}{{ end }}
{{- $_ := include "gha-rs.mergeByName" (dict "first" $runner.volumeMounts "second" $chartMounts "out" $mergedList) }}
{{- if $mergedList.result }}
{{- $_ := set $runner "volumeMounts" $mergedList.result }}
{{- else if eq $mode "kubernetes-novolume" }}
{{- /* The novolume hooks expect the key to exist even when there is nothing to mount. */}}
{{- $_ := set $runner "volumeMounts" list }}
{{- else }}
{{- $_ := unset $runner "volumeMounts" }}
{{- end }}

{{- /* The dind container: a native sidecar where supported, else a regular container. */}}
{{- $sidecar := include "gha-rs.dindSidecarSupported" $root }}
{{- $userInit := $userSpec.initContainers | default list }}
{{- $dind := dict }}
{{- $initDindExternals := dict }}
{{- if eq $mode "dind" }}
{{- $dindBase := dict "name" "dind" "image" "docker:dind" "args" (list "dockerd" "--host=unix:///var/run/docker.sock" "--group=$(DOCKER_GROUP_GID)") "env" (list (dict "name" "DOCKER_GROUP_GID" "value" "123")) "securityContext" (dict "privileged" true) "volumeMounts" (list $workMount (dict "name" "dind-sock" "mountPath" "/var/run") (dict "name" "dind-externals" "mountPath" "/home/runner/externals")) }}
{{- if $sidecar }}
{{- $_ := set $dindBase "restartPolicy" "Always" }}
{{- $_ := set $dindBase "startupProbe" (dict "exec" (dict "command" (list "docker" "info")) "initialDelaySeconds" 0 "failureThreshold" 24 "periodSeconds" 5) }}
{{- end }}
{{- $_ := include "gha-rs.findByName" (dict "list" $userContainers "name" "dind" "out" $found) }}
{{- if empty $found.result }}
{{- $_ := include "gha-rs.findByName" (dict "list" $userInit "name" "dind" "out" $found) }}
{{- end }}
{{- $_ := include "gha-rs.mergeContainer" (dict "base" $dindBase "override" $found.result "out" $merged) }}
{{- $dind = $merged.result }}
{{- $externalsBase := dict "name" "init-dind-externals" "image" $runner.image "command" (list "cp") "args" (list "-r" "/home/runner/externals/." "/home/runner/tmpDir/") "volumeMounts" (list (dict "name" "dind-externals" "mountPath" "/home/runner/tmpDir")) }}
{{- $_ := include "gha-rs.findByName" (dict "list" $userInit "name" "init-dind-externals" "out" $found) }}
{{- $_ := include "gha-rs.mergeContainer" (dict "base" $externalsBase "override" $found.result "out" $merged) }}
{{- $initDindExternals = $merged.result }}
{{- end }}

{{- /* containers */}}
{{- $containers := list }}
{{- if $mode }}
{{- $containers = list $runner }}
{{- if and (eq $mode "dind") (not $sidecar) }}
{{- $containers = append $containers $dind }}
{{- end }}
{{- range $userContainers }}
{{- $name := toString .name }}
{{- if not (or (eq $name "runner") (and (eq $mode "dind") (eq $name "dind"))) }}
{{- $containers = append $containers . }}
{{- end }}
{{- end }}
{{- else }}
{{- if empty $userRunner }}{{ $containers = list $runner }}{{ end }}
{{- range $userContainers }}
{{- $containers = append $containers (eq (toString .name) "runner" | ternary $runner .) }}
{{- end }}
{{- end }}
{{- $_ := set $spec "containers" $containers }}

{{- /* initContainers */}}
{{- $initContainers := list }}
{{- if eq $mode "dind" }}
{{- $initContainers = list $initDindExternals }}
{{- if $sidecar }}{{ $initContainers = append $initContainers $dind }}{{ end }}
{{- range $userInit }}
{{- if not (has (toString .name) (list "dind" "init-dind-externals")) }}
{{- $initContainers = append $initContainers . }}
{{- end }}
{{- end }}
{{- else }}
{{- $initContainers = $userInit }}
{{- end }}
{{- if $initContainers }}{{ $_ := set $spec "initContainers" $initContainers }}{{ end }}

{{- /* volumes */}}
{{- $_ := include "gha-rs.mergeVolumes" (dict "chart" $chartVolumes "user" $userSpec.volumes "out" $mergedList) }}
{{- if $mergedList.result }}
{{- $_ := set $spec "volumes" $mergedList.result }}
{{- else if eq $mode "kubernetes-novolume" }}
{{- $_ := set $spec "volumes" list }}
{{- end }}

{{- if $metadata }}{{ $_ := set $out "metadata" $metadata }}{{ end }}
{{- $_ := set $out "spec" $spec }}
{{- end }}

{{/*
The listener pod template: the user's listenerTemplate, plus (beyond upstream) a liveness probe on
the listener container unless the user's listener container brings its own.
*/}}
{{- define "gha-rs.listenerTemplate" -}}
{{- $root := .root }}
{{- $template := deepCopy ($root.Values.listenerTemplate | default dict) }}
{{- $liveness := $root.Values.listenerLivenessProbe | default dict }}
{{- if and $liveness.enabled $liveness.probe }}
{{- $spec := $template.spec | default dict }}
{{- $containers := list }}
{{- $hasListener := false }}
{{- range ($spec.containers | default list) }}
{{- if and (not $hasListener) (eq (toString .name) "listener") }}
{{- $hasListener = true }}
{{- if not (hasKey . "livenessProbe") }}{{ $_ := set . "livenessProbe" $liveness.probe }}{{ end }}
{{- end }}
{{- $containers = append $containers . }}
{{- end }}
{{- if not $hasListener }}
{{- $containers = prepend $containers (dict "name" "listener" "livenessProbe" $liveness.probe) }}
{{- end }}
{{- $_ := set $spec "containers" $containers }}
{{- $_ := set $template "spec" $spec }}
{{- end }}
{{- if $template }}{{ $_ := set .out "result" $template }}{{ end }}
{{- end }}
