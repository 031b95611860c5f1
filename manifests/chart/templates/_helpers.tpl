{{/* Labels of every object: the same as manifests/ (kustomize adds part-of). */}}
{{- define "meshlet.labels" -}}
app.kubernetes.io/name: meshlet
app.kubernetes.io/part-of: meshlet
{{- end -}}
{{- define "meshlet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
