{{/*
Names are fixed, not derived from the release: meshlet's agents, `meshlet
diagnose` and the docs find the DaemonSet, Service and ServiceAccount called
meshlet (one meshlet per cluster, in the namespace of its ClusterMeshes).
*/}}

{{/* helm.sh/chart: name-version ("+" is not allowed in a label value). */}}
{{- define "meshlet.chart" -}}
{{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/*
The DaemonSet's selector: app.kubernetes.io/name alone, as every release
before 0.1.0 rendered it. A DaemonSet's selector cannot change, so adding
app.kubernetes.io/instance here would make `helm upgrade` from those
releases fail (docs/releasing.md, "Upgrades").
*/}}
{{- define "meshlet.selectorLabels" -}}
app.kubernetes.io/name: meshlet
{{- end -}}

{{/*
Labels of every object (Helm's and Kubernetes' recommended set); component
is "agent" unless given: include "meshlet.labels" (list . "monitoring"), and
name is meshlet unless given: (list . "test" "meshlet-test") for helm test's
pod, which `meshlet diagnose` must not take for an agent (it selects
app.kubernetes.io/name=meshlet). name, component and part-of are what
manifests/ (kustomize) sets too.
*/}}
{{- define "meshlet.labels" -}}
{{- $ctx := . -}}
{{- $component := "agent" -}}
{{- $name := "meshlet" -}}
{{- if kindIs "slice" . -}}
{{- $ctx = index . 0 -}}
{{- $component = index . 1 -}}
{{- if gt (len .) 2 }}{{ $name = index . 2 }}{{ end -}}
{{- end -}}
app.kubernetes.io/name: {{ $name }}
app.kubernetes.io/instance: {{ $ctx.Release.Name }}
app.kubernetes.io/version: {{ $ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $ctx.Release.Service }}
app.kubernetes.io/component: {{ $component }}
app.kubernetes.io/part-of: meshlet
helm.sh/chart: {{ include "meshlet.chart" $ctx }}
{{- end -}}

{{/* The image: repository@digest when image.digest is set, else repository:tag (default: the chart's appVersion). */}}
{{- define "meshlet.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The API server's address, as the agent reaches it (KubePrism on Talos), for the agent and helm test. */}}
{{- define "meshlet.apiServerEnv" -}}
{{- with .Values.apiServer.host }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ . | quote }}
{{- end }}
{{- with .Values.apiServer.port }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{/*
The kubeconfig Secrets the agents may read (docs/security.md#least-privilege),
as a JSON list: remoteSecrets and those the clusterMesh below names; empty
when there are none.
*/}}
{{- define "meshlet.remoteSecretNames" -}}
{{- $names := list }}
{{- range .Values.remoteSecrets }}{{ $names = append $names . }}{{ end }}
{{- if .Values.clusterMesh.enabled }}
{{- range .Values.clusterMesh.clusters }}
{{- if and .kubeconfigSecretRef .kubeconfigSecretRef.name }}{{ $names = append $names .kubeconfigSecretRef.name }}{{ end }}
{{- end }}
{{- end }}
{{- if $names }}{{ $names | uniq | toJson }}{{ end }}
{{- end }}

{{/*
The securityContext of the agent's container, (list . "agent"), and of the
userspace device's sidecar, (list . "wireguard"). privileged: true, as
Kilo's kg; privileged: false is the capability-only mode
(docs/security.md#capabilities): the agent keeps NET_ADMIN (links, routes,
rules, WireGuard, iptables) and NET_RAW (its ICMP probes, iptables-legacy),
the sidecar NET_ADMIN (the TUN link), nothing else; no privilege escalation,
the runtime's default seccomp profile.
*/}}
{{- define "meshlet.securityContext" -}}
{{- $ctx := index . 0 -}}
{{- if $ctx.Values.privileged -}}
privileged: true
runAsUser: 0
readOnlyRootFilesystem: true
{{- else -}}
privileged: false
allowPrivilegeEscalation: false
runAsUser: 0
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
  add: {{ if eq (index . 1) "agent" }}[NET_ADMIN, NET_RAW]{{ else }}[NET_ADMIN]{{ end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}
{{- end -}}

{{/*
Which container gets the host's /dev/net/tun: in the capability-only mode
with a userspace device possible (the sidecar, or wireguard.mode auto or
userspace), the
container that runs the device ("wireguard", the sidecar, or "agent", the
child device); "" otherwise. A privileged container sees the host's /dev.
*/}}
{{- define "meshlet.tunMount" -}}
{{- if and (not .Values.privileged) (or .Values.wireguard.sidecar (ne .Values.wireguard.mode "kernel")) -}}
{{ if .Values.wireguard.sidecar }}wireguard{{ else }}agent{{ end }}
{{- end -}}
{{- end -}}
