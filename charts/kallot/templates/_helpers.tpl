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

