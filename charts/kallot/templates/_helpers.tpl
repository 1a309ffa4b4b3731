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

{{- define "kallot.selector" -}}
app.kubernetes.io/name: kallot
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
