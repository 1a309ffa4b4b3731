{{- define "kallot.fullname" -}}
{{- if eq .Release.Name .Chart.Name }}{{ .Chart.Name }}{{ else }}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{ end }}
{{- end }}

{{- define "kallot.labels" -}}
app.kubernetes.io/name: kallot
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: scheduler
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- /* The scheduler's pods only: the component label keeps the agent's pods out of its
Service, PodDisruptionBudget and anti-affinity (the agent selects component: agent). */ -}}
{{- define "kallot.selector" -}}
app.kubernetes.io/name: kallot
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: scheduler
{{- end }}

{{- define "kallot.agent.labels" -}}
app.kubernetes.io/name: kallot
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: agent
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "kallot.agent.selector" -}}
app.kubernetes.io/name: kallot
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end }}


{{- /* The scheduler configuration document: schedulerConfig with apiVersion and kind filled in
when the value leaves them out. */ -}}
{{- define "kallot.schedulerConfig" -}}
{{- $head := dict "apiVersion" "kallot.io/v1alpha1" "kind" "KallotSchedulerConfiguration" -}}
{{- toYaml (mergeOverwrite $head (deepCopy .Values.schedulerConfig)) -}}
{{- end }}

{{/* The agents' exporter speaks HTTPS with agent.metricsAuth=delegated, else HTTP. */}}
{{- define "kallot.agentScheme" -}}
{{- if eq .Values.agent.metricsAuth "delegated" }}HTTPS{{ else }}HTTP{{ end -}}
{{- end }}

{{- /* apiServer.host: the API server's address in both containers, instead of the kubernetes
Service's that the kubelet injects (the container's own env wins over the kubelet's). */ -}}
{{- define "kallot.apiServerEnv" -}}
{{- with .Values.apiServer.host }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ . | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ $.Values.apiServer.port | quote }}
{{- end }}
{{- end }}
