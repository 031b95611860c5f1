package apiserver

// PodSecurityBaseline is an admission configuration (kube-apiserver
// --admission-control-config-file) that enforces Pod Security "baseline" in
// every namespace but kube-system, as Talos does; audit and warn at
// "restricted", as there.
const PodSecurityBaseline = `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: PodSecurity
    configuration:
      apiVersion: pod-security.admission.config.k8s.io/v1
      kind: PodSecurityConfiguration
      defaults: {enforce: baseline, enforce-version: latest, audit: restricted, audit-version: latest, warn: restricted, warn-version: latest}
      exemptions: {usernames: [], runtimeClasses: [], namespaces: [kube-system]}
`
