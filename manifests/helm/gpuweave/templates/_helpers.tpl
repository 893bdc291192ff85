{{/*
A file of the kustomize base, linked under files/, with the base's namespace (gpuweave-system)
replaced by the release namespace (also in service-account user names, as the admission policy
names them). Used for the objects no value changes (RBAC), so the chart and
the base install the same text. A missing file fails the render instead of rendering nothing.
*/}}
{{- define "gpuweave.baseFile" -}}
{{- $content := .root.Files.Get .file -}}
{{- if not $content -}}
{{- fail (printf "chart file %s is missing or empty (a link to the kustomize base?)" .file) -}}
{{- end -}}
{{- $content | replace "namespace: gpuweave-system" (printf "namespace: %s" .root.Release.Namespace) | replace "serviceaccount:gpuweave-system:" (printf "serviceaccount:%s:" .root.Release.Namespace) -}}
{{- end -}}

{{/* The gpuweave image (node agent and extender). */}}
{{- define "gpuweave.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{- define "gpuweave.pullPolicy" -}}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end -}}

{{/*
What monitoring renders, as JSON: monitoring.enabled turns every part on; any part on turns the
node agents' /metrics on (the dashboard's health panels and the alerts read them), as does
nodeAgent.metrics.enabled alone.
*/}}
{{- define "gpuweave.monitoring" -}}
{{- $m := .Values.monitoring -}}
{{- $all := $m.enabled -}}
{{- $parts := dict "serviceMonitor" (or $all $m.serviceMonitor.enabled) "prometheusRule" (or $all $m.prometheusRule.enabled) "dashboard" (or $all $m.dashboard.enabled) -}}
{{- $any := or $parts.serviceMonitor $parts.prometheusRule $parts.dashboard -}}
{{- $_ := set $parts "agentMetrics" (or $any .Values.nodeAgent.metrics.enabled) -}}
{{- toJson $parts -}}
{{- end -}}

{{/* Node-agent configuration files (ConfigMap gpuweave-node-agent-config), by file name. */}}
{{- define "gpuweave.nodeAgentConfig" -}}
{{- $files := dict -}}
{{- with .Values.nodeAgent.sharing -}}
{{- $sharing := merge (dict "apiVersion" "gpuweave.io/v1alpha1" "kind" "SharingConfig" "mpsPipeDirectory" "/run/gpuweave/mps") (deepCopy .) -}}
{{- $_ := set $files "sharing-config.yaml" (toYaml $sharing) -}}
{{- end -}}
{{- with .Values.nodeAgent.health -}}
{{- $_ := set $files "health-config.yaml" (toYaml (dict "health" .)) -}}
{{- end -}}
{{- toJson $files -}}
{{- end -}}

{{/*
The named sharing configurations (ConfigMap gpuweave-node-agent-sharing, mounted as
--sharing-config-dir): <name>.yaml per entry of nodeAgent.sharingConfigs; a Node labelled
gpuweave.io/sharing-config=<name> is served with it.
*/}}
{{- define "gpuweave.nodeAgentSharingConfigs" -}}
{{- $files := dict -}}
{{- range $name, $config := .Values.nodeAgent.sharingConfigs -}}
{{- $sharing := merge (dict "apiVersion" "gpuweave.io/v1alpha1" "kind" "SharingConfig" "mpsPipeDirectory" "/run/gpuweave/mps") (deepCopy $config) -}}
{{- $_ := set $files (printf "%s.yaml" $name) (toYaml $sharing) -}}
{{- end -}}
{{- toJson $files -}}
{{- end -}}

{{/*
The scheduler configuration: manifests/scheduler/scheduler-config.yaml, with
scheduler.extender.claims.enabled the entry of manifests/scheduler/claims-extender.yaml appended
to its extenders, the extender's weight (the first entry's; the claims entry's weight line carries
a comment, so it is not matched) and, with TLS, the HTTPS settings of every entry (same sidecar)
put in. Each edited line must be found
exactly as often as stated, so a reformatted base file fails the render instead of being left
unedited.
*/}}
{{- define "gpuweave.schedulerConfig" -}}
{{- $config := include "gpuweave.baseFile" (dict "root" . "file" "files/scheduler-config.yaml") -}}
{{- $entries := 1 -}}
{{- if .Values.scheduler.extender.claims.enabled -}}
{{- $config = printf "%s\n%s" (trimSuffix "\n" $config) (include "gpuweave.baseFile" (dict "root" . "file" "files/claims-extender.yaml")) -}}
{{- $entries = 2 -}}
{{- end -}}
{{- $edits := list (list "(?m)^    weight: [0-9]+$" (printf "    weight: %d" (int .Values.scheduler.extender.weight)) 1) -}}
{{- $tls := .Values.scheduler.extender.tls -}}
{{- if $tls.enabled -}}
{{- $tlsConfig := dict "caFile" "/etc/gpuweave-extender-tls/ca.crt" -}}
{{- with $tls.serverName }}{{ $_ := set $tlsConfig "serverName" . }}{{ end -}}
{{- $edits = append $edits (list "(?m)^  - urlPrefix: http://127\\.0\\.0\\.1:8888$" "  - urlPrefix: https://127.0.0.1:8888" $entries) -}}
{{- $edits = append $edits (list "(?m)^    enableHTTPS: false.*$" (printf "    enableHTTPS: true\n    tlsConfig: %s" (toJson $tlsConfig)) $entries) -}}
{{- end -}}
{{- range $edits -}}
{{- $found := regexFindAll (index . 0) $config -1 | len -}}
{{- if ne $found (index . 2) -}}
{{- fail (printf "scheduler-config.yaml: %d lines match %s, want %d" $found (index . 0) (index . 2)) -}}
{{- end -}}
{{- $config = regexReplaceAll (index . 0) $config (index . 1) -}}
{{- end -}}
{{- $config -}}
{{- end -}}

{{/*
The generated ConfigMap's name as kustomize's configMapGenerator makes it (api/hasher): the name,
"-", and the first 10 hex digits of sha256 over {"data":...,"kind":"ConfigMap","name":""}
(encoding/json, keys sorted) with 0,1,3,a,e spelled g,h,k,m,t. The name in the hashed map is
empty because kustomize looks it up as one field called "metadata/name", which no object has. A
new configuration gets a new name, which rolls the Deployment as it does under kustomize.
*/}}
{{- define "gpuweave.schedulerConfigName" -}}
{{- $data := dict "scheduler-config.yaml" (include "gpuweave.schedulerConfig" .) -}}
{{- $hash := dict "data" $data "kind" "ConfigMap" "name" "" | toJson | sha256sum | trunc 10 -}}
gpuweave-scheduler-config-{{ $hash | replace "0" "g" | replace "1" "h" | replace "3" "k" | replace "a" "m" | replace "e" "t" }}
{{- end -}}
