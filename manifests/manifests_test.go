package manifests_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/e2e/apiserver"
	"github.com/meshlet/meshlet/e2e/harness"
)

const ns = "kilo-system"

var (
	peersGVR = schema.GroupVersionResource{Group: "kilo.squat.ai", Version: "v1alpha1", Resource: "peers"}
	cmGVR    = schema.GroupVersionResource{Group: "kilo.squat.ai", Version: "v1alpha1", Resource: "clustermeshes"}
)

// kustomizeBuild renders dir with kustomize (hack/k8s/ensure.sh tools), or
// with `kubectl kustomize` (kubectl embeds kustomize) when only the k8s
// binaries are at hand.
func kustomizeBuild(t *testing.T, dir string) []byte {
	t.Helper()
	var cmd *exec.Cmd
	if tools, err := apiserver.ToolsDir(); err == nil {
		cmd = exec.Command(filepath.Join(tools, "kustomize"), "build", dir)
	} else if p, err2 := exec.LookPath("kustomize"); err2 == nil {
		cmd = exec.Command(p, "build", dir)
	} else if kubectl, err3 := apiserver.Bin("kubectl"); err3 == nil {
		cmd = exec.Command(kubectl, "kustomize", dir)
	} else {
		apiserver.SkipOrFail(t, "no kustomize: %v; %v; %v", err, err2, err3)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, stderr.String())
	}
	return out
}

func decode(t *testing.T, b []byte) []*unstructured.Unstructured {
	t.Helper()
	objs, err := apiserver.DecodeYAML(b)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

func TestKustomizeBuild(t *testing.T) {
	objs := decode(t, kustomizeBuild(t, "."))
	want := map[string]string{
		"ServiceAccount":                   "meshlet",
		"ClusterRole":                      "meshlet",
		"ClusterRoleBinding":               "meshlet",
		"Role":                             "meshlet",
		"RoleBinding":                      "meshlet",
		"DaemonSet":                        "meshlet",
		"Service":                          "meshlet",
		"ValidatingAdmissionPolicy":        "meshlet",
		"ValidatingAdmissionPolicyBinding": "meshlet",
	}
	for kind, name := range want {
		if find(objs, kind, name) == nil {
			t.Errorf("kustomize build: no %s %s", kind, name)
		}
	}
	// Only meshlet's own objects: `kubectl delete -k manifests` must never
	// delete a namespace, a CRD (with every Peer) or anything that needs the
	// Prometheus Operator's CRDs.
	for _, o := range objs {
		switch o.GetKind() {
		case "Namespace", "CustomResourceDefinition", "PodMonitor", "PrometheusRule":
			t.Errorf("kustomize build manifests/ holds %s %s: it belongs in a separate component", o.GetKind(), o.GetName())
		}
	}
	if len(objs) != len(want) {
		t.Errorf("kustomize build manifests/: %d objects, want %d", len(objs), len(want))
	}
	for dir, kinds := range map[string][]string{
		"namespace":  {"Namespace/kilo-system"},
		"crds":       {"CustomResourceDefinition/peers.kilo.squat.ai", "CustomResourceDefinition/clustermeshes.kilo.squat.ai"},
		"monitoring": {"PodMonitor/meshlet", "PrometheusRule/meshlet", "ConfigMap/meshlet-dashboard"},
	} {
		got := decode(t, kustomizeBuild(t, dir))
		for _, kn := range kinds {
			kind, name, _ := strings.Cut(kn, "/")
			if find(got, kind, name) == nil {
				t.Errorf("kustomize build %s: no %s", dir, kn)
			}
		}
		if len(got) != len(kinds) {
			t.Errorf("kustomize build %s: %d objects, want %v", dir, len(got), kinds)
		}
	}
	nsObj := decode(t, kustomizeBuild(t, "namespace"))[0]
	if l := nsObj.GetLabels()["pod-security.kubernetes.io/enforce"]; l != "privileged" {
		t.Errorf("namespace label pod-security.kubernetes.io/enforce=%q, want privileged", l)
	}
	objs = append(objs, decode(t, kustomizeBuild(t, "monitoring"))...)
	ds := find(objs, "DaemonSet", "meshlet")
	if ds == nil {
		t.FailNow()
	}
	// The image is set by the kustomization, not left as the placeholder.
	cs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	img := cs[0].(map[string]any)["image"].(string)
	if !strings.HasPrefix(img, "ghcr.io/meshlet/meshlet:") {
		t.Errorf("DaemonSet image %q", img)
	}
	// The PodMonitor scrapes the port the DaemonSet names, on its pods.
	pm := find(objs, "PodMonitor", "meshlet")
	sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	podLabels, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "template", "metadata", "labels")
	for k, v := range sel {
		if podLabels[k] != v {
			t.Errorf("PodMonitor selects %s=%s, pods have %v", k, v, podLabels)
		}
	}
	eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	port := eps[0].(map[string]any)["port"]
	ports := cs[0].(map[string]any)["ports"].([]any)
	if ports[0].(map[string]any)["name"] != port {
		t.Errorf("PodMonitor port %v, container ports %v", port, ports)
	}
	// Its job is the pods' label value "meshlet" (the alerts select none:
	// TestMonitoringObjects).
	jobLabel, _, _ := unstructured.NestedString(pm.Object, "spec", "jobLabel")
	if podLabels[jobLabel] != "meshlet" {
		t.Errorf("PodMonitor jobLabel %q gives job %q, want meshlet", jobLabel, podLabels[jobLabel])
	}

	remote := decode(t, kustomizeBuild(t, "remote"))
	for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} {
		if find(remote, kind, "meshlet-remote") == nil {
			t.Errorf("kustomize build remote: no %s meshlet-remote", kind)
		}
	}

	// Least privilege: no Secret without a name (components/remote-secrets
	// adds the named ones).
	for _, dir := range []string{".", "talos", "dropin"} {
		for _, o := range decode(t, kustomizeBuild(t, dir)) {
			rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
			for _, r := range rules {
				r := r.(map[string]any)
				if names, _ := r["resourceNames"].([]any); strings.Contains(fmt.Sprint(r["resources"]), "secrets") && len(names) == 0 {
					t.Errorf("kustomize build %s: %s %s grants Secrets without names: %v", dir, o.GetKind(), o.GetName(), r)
				}
			}
		}
	}
	named := find(decode(t, kustomizeBuild(t, "testdata/remote-secrets")), "Role", "meshlet")
	if r := fmt.Sprint(named.Object["rules"]); !strings.Contains(r, "resourceNames:[cluster-b-kubeconfig] resources:[secrets] verbs:[list watch]") {
		t.Errorf("components/remote-secrets: Role rules %s, want list and watch on the Secret cluster-b-kubeconfig", r)
	}

	// The admission policy names the ServiceAccount its build binds:
	// meshlet's in manifests/ and talos/, Kilo's in the drop-in's add-on
	// (kube-system, or whatever namespace dropin/grants/kustomization.yaml sets).
	for dir, want := range map[string]string{
		".":                "ValidatingAdmissionPolicy/meshlet system:serviceaccount:' + 'kilo-system' + ':' + 'meshlet'",
		"talos":            "ValidatingAdmissionPolicy/meshlet system:serviceaccount:' + 'kilo-system' + ':' + 'meshlet'",
		"dropin/admission": "ValidatingAdmissionPolicy/meshlet-dropin system:serviceaccount:' + 'kube-system' + ':' + 'kilo'",
	} {
		objs := decode(t, kustomizeBuild(t, dir))
		kn, user, _ := strings.Cut(want, " ")
		kind, name, _ := strings.Cut(kn, "/")
		p := find(objs, kind, name)
		if p == nil {
			t.Errorf("kustomize build %s: no %s", dir, kn)
			continue
		}
		mcs, _, _ := unstructured.NestedSlice(p.Object, "spec", "matchConditions")
		if got := fmt.Sprint(mcs); len(mcs) != 1 || !strings.Contains(got, "request.userInfo.username == '"+user) {
			t.Errorf("kustomize build %s: %s matchConditions %s, want the user %s", dir, kn, got, user)
		}
		if b := find(objs, "ValidatingAdmissionPolicyBinding", name); b == nil {
			t.Errorf("kustomize build %s: no ValidatingAdmissionPolicyBinding %s", dir, name)
		} else if policy, _, _ := unstructured.NestedString(b.Object, "spec", "policyName"); policy != name {
			t.Errorf("kustomize build %s: binding %s of policy %q, want %s", dir, name, policy, name)
		}
	}
	if got := len(decode(t, kustomizeBuild(t, "dropin/admission"))); got != len(decode(t, kustomizeBuild(t, "dropin")))+2 {
		t.Errorf("kustomize build dropin/admission: %d objects, want the grants and the policy with its binding", got)
	}
	// Cozystack: the one namespace the docs say to set moves the grants,
	// their subjects and the policy's user to cozy-kilo.
	tmp := t.TempDir()
	for _, dir := range []string{"dropin", "components"} {
		if err := os.CopyFS(filepath.Join(tmp, dir), os.DirFS(dir)); err != nil {
			t.Fatal(err)
		}
	}
	kf := filepath.Join(tmp, "dropin", "grants", "kustomization.yaml")
	k, err := os.ReadFile(kf)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kf, bytes.Replace(k, []byte("namespace: kube-system"), []byte("namespace: cozy-kilo"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	cozy := kustomizeBuild(t, filepath.Join(tmp, "dropin", "admission"))
	if n := bytes.Count(cozy, []byte("namespace: cozy-kilo")); bytes.Contains(cozy, []byte("kube-system")) || n != 4 {
		t.Errorf("dropin/admission with namespace cozy-kilo: %d objects and subjects in cozy-kilo, kube-system left: %v\n%s", n, bytes.Contains(cozy, []byte("kube-system")), cozy)
	}
	if !bytes.Contains(cozy, []byte("'system:serviceaccount:' + 'cozy-kilo'")) {
		t.Errorf("dropin/admission with namespace cozy-kilo: the policy does not name cozy-kilo/kilo:\n%s", cozy)
	}
}

// TestPrometheusRuleMatchesRulesFile keeps the PrometheusRule and the plain
// rules file (the one promtool checks) identical.
func TestPrometheusRuleMatchesRulesFile(t *testing.T) {
	var plain, pr map[string]any
	mustYAML(t, "monitoring/rules.yaml", &plain)
	mustYAML(t, "monitoring/prometheusrule.yaml", &pr)
	spec := pr["spec"].(map[string]any)
	if !reflect.DeepEqual(plain["groups"], spec["groups"]) {
		t.Fatalf("monitoring/prometheusrule.yaml spec.groups differs from monitoring/rules.yaml:\n%v\n%v", spec["groups"], plain["groups"])
	}
}

// TestAlertRunbooks: every alert has a runbook_url to its own section of
// docs/runbooks.md, and every section there belongs to an alert.
func TestAlertRunbooks(t *testing.T) {
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `json:"alert"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	mustYAML(t, "monitoring/rules.yaml", &rules)
	doc, err := os.ReadFile("../docs/runbooks.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]bool{}
	for _, l := range strings.Split(string(doc), "\n") {
		// The second part is diagnose's findings (agent/core/diagnose
		// tests its sections).
		if strings.HasPrefix(l, "# Runbooks for `meshlet diagnose`") {
			break
		}
		if h, ok := strings.CutPrefix(l, "## "); ok {
			sections[h] = true
		}
	}
	const base = "https://github.com/meshlet/meshlet/blob/main/docs/runbooks.md#"
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts[r.Alert] = true
			// GitHub's anchor of a heading "## MeshletPeerDown" is its lower case.
			if want := base + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
				t.Errorf("%s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
			}
			if !sections[r.Alert] {
				t.Errorf("%s: no section \"## %s\" in docs/runbooks.md", r.Alert, r.Alert)
			}
		}
	}
	for h := range sections {
		if !alerts[h] {
			t.Errorf("docs/runbooks.md has a section %q for no alert", h)
		}
	}
}

// TestDashboardQueries: every panel of the Grafana dashboard has queries,
// on the dashboard's data source variable, and each is valid PromQL
// (promtool checks them as recording rules). That they return data on a
// real mesh is TestAlertsOnPrometheus's part (make e2e).
func TestDashboardQueries(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		apiserver.SkipOrFail(t, "promtool not installed (apt-get install prometheus): %v", err)
	}
	qs, err := harness.DashboardQueries("monitoring/dashboard.json", map[string]string{"cluster": ".*", "node": ".*", "__rate_interval": "5m"})
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			Type       string         `json:"type"`
			Title      string         `json:"title"`
			Datasource map[string]any `json:"datasource"`
		} `json:"panels"`
	}
	b, err := os.ReadFile("monitoring/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if d.UID != "meshlet" {
		t.Errorf("uid %q, want meshlet (stable links)", d.UID)
	}
	for _, p := range d.Panels {
		if p.Type != "row" && p.Datasource["uid"] != "${datasource}" {
			t.Errorf("panel %q: data source %v, want the ${datasource} variable", p.Title, p.Datasource)
		}
	}
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, q := range qs {
		e, _ := json.Marshal(q.Expr)
		fmt.Fprintf(&rules, "      - record: dashboard_query_%d\n        expr: %s\n", i, e)
	}
	f := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(f, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput(); err != nil {
		t.Errorf("dashboard queries do not parse: %v\n%s\n%s", err, out, rules.String())
	}
	t.Logf("%d queries in %d panels", len(qs), len(d.Panels))
}

func TestPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		apiserver.SkipOrFail(t, "promtool not installed (apt-get install prometheus): %v", err)
	}
	for _, args := range [][]string{
		{"check", "rules", "rules.yaml"},
		// Every alert fires and does not fire; among them a keepalive-250
		// peer (handshake age past 210 s) and an idle peer never fire.
		{"test", "rules", "rules_test.yaml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "monitoring"
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

func mustYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// Minimal stand-ins for the Prometheus Operator's CRDs: the real ones are
// large and not vendored here. They let the PodMonitor and PrometheusRule go
// through the same server-side dry-run as everything else (apiVersion, kind,
// namespace, metadata); their content is checked by TestKustomizeBuild (the
// PodMonitor's selector and port) and by promtool (the rules).
const monitoringCRDs = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: podmonitors.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  names: {kind: PodMonitor, plural: podmonitors, singular: podmonitor}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [selector]
            x-kubernetes-preserve-unknown-fields: true
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: prometheusrules.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  names: {kind: PrometheusRule, plural: prometheusrules, singular: prometheusrule}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              groups:
                type: array
                items:
                  type: object
                  required: [name, rules]
                  x-kubernetes-preserve-unknown-fields: true
`

func TestManifestsOnAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv := apiserver.Start(t, apiserver.Options{})
	admin := srv.AdminConfig()
	cs := kubernetes.NewForConfigOrDie(admin)
	dyn := dynamic.NewForConfigOrDie(admin)

	local := decode(t, kustomizeBuild(t, "."))
	for _, dir := range []string{"namespace", "crds", "monitoring"} {
		local = append(local, decode(t, kustomizeBuild(t, dir))...)
	}
	remote := decode(t, kustomizeBuild(t, "remote"))

	// Namespaced objects and custom resources can only be dry-run once their
	// namespace and CRDs really exist: create those first.
	var prereq []*unstructured.Unstructured
	for _, o := range local {
		if o.GetKind() == "Namespace" || o.GetKind() == "CustomResourceDefinition" {
			prereq = append(prereq, o)
		}
	}
	if _, err := apiserver.Apply(ctx, admin, []byte(monitoringCRDs), apiserver.ApplyOptions{}); err != nil {
		t.Fatalf("monitoring CRD stand-ins: %v", err)
	}
	if _, err := apiserver.ApplyObjects(ctx, admin, prereq, apiserver.ApplyOptions{}); err != nil {
		t.Fatalf("namespace and CRDs: %v", err)
	}

	t.Run("DryRun", func(t *testing.T) {
		for name, objs := range map[string][]*unstructured.Unstructured{"manifests": local, "manifests/remote": remote} {
			got, err := apiserver.ApplyObjects(ctx, admin, objs, apiserver.ApplyOptions{DryRun: true})
			if err != nil {
				t.Errorf("%s: server-side dry-run: %v", name, err)
			}
			if len(got) != len(objs) {
				t.Errorf("%s: %d of %d objects accepted", name, len(got), len(objs))
			}
		}
		ex, err := os.ReadFile("examples/clustermesh.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := apiserver.Apply(ctx, admin, ex, apiserver.ApplyOptions{DryRun: true}); err != nil {
			t.Errorf("examples/clustermesh.yaml: %v", err)
		}
		// The Kilo affinity patch, applied to a DaemonSet shaped like Kilo's.
		patch, err := os.ReadFile("examples/kilo-daemonset-affinity.yaml")
		if err != nil {
			t.Fatal(err)
		}
		kiloDS := `{"apiVersion":"apps/v1","kind":"DaemonSet","metadata":{"name":"kilo","namespace":"kilo-system"},
			"spec":{"selector":{"matchLabels":{"app":"kilo"}},"template":{"metadata":{"labels":{"app":"kilo"}},
			"spec":{"containers":[{"name":"kilo","image":"squat/kilo:0.7.0"}]}}}}`
		if _, err := cs.AppsV1().DaemonSets(ns).Create(ctx, mustDS(t, kiloDS), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pj, err := yaml.YAMLToJSON(patch)
		if err != nil {
			t.Fatal(err)
		}
		got, err := cs.AppsV1().DaemonSets(ns).Patch(ctx, "kilo", types.StrategicMergePatchType, pj, metav1.PatchOptions{})
		if err != nil {
			t.Fatalf("affinity patch: %v", err)
		}
		expr := got.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0]
		if expr.Key != "meshlet.io/agent" || expr.Operator != corev1.NodeSelectorOpNotIn || got.Spec.Template.Spec.Containers[0].Image != "squat/kilo:0.7.0" {
			t.Errorf("patched Kilo DaemonSet: %+v, image %s", expr, got.Spec.Template.Spec.Containers[0].Image)
		}
	})

	t.Run("Discovery", func(t *testing.T) {
		rl, err := cs.Discovery().ServerResourcesForGroupVersion("kilo.squat.ai/v1alpha1")
		if err != nil {
			t.Fatal(err)
		}
		byName := map[string]metav1.APIResource{}
		for _, r := range rl.APIResources {
			byName[r.Name] = r
		}
		if p := byName["peers"]; p.Kind != "Peer" || p.Namespaced {
			t.Errorf("peers: %+v, want cluster-scoped kind Peer", p)
		}
		if c := byName["clustermeshes"]; c.Kind != "ClusterMesh" || !c.Namespaced || !reflect.DeepEqual(c.ShortNames, []string{"cm"}) {
			t.Errorf("clustermeshes: %+v, want namespaced kind ClusterMesh, short name cm", c)
		}
		if _, ok := byName["clustermeshes/status"]; !ok {
			t.Error("clustermeshes has no status subresource")
		}
	})

	t.Run("PeerRoundTrip", func(t *testing.T) {
		// Every field of Kilo's Peer, as Kilo's docs write them.
		in := `
apiVersion: kilo.squat.ai/v1alpha1
kind: Peer
metadata: {name: laptop}
spec:
  allowedIPs: [10.5.0.1/32, 10.5.1.0/24]
  endpoint: {dnsOrIP: {dns: vpn.example.com, ip: 203.0.113.7}, port: 51820}
  persistentKeepalive: 25
  presharedKey: KVLyHdJ3WfR9aLFFsykVuGUPF1BVLpJZXRtjhm5YsVI=
  publicKey: GY5aT1N9dTR/nJnT1N2f4ClZWVj0jOAld0r8ysWLyjg=
`
		got := roundTrip(ctx, t, dyn.Resource(peersGVR), in)
		// The server kept exactly what was sent; and meshlet's Go type reads
		// and writes the same JSON (no field renamed or dropped).
		var typed kilo.Peer
		assertSpecRoundTrip(t, in, got, &typed, func() any { return typed.Spec })
		if typed.Spec.Endpoint == nil || typed.Spec.Endpoint.DNSOrIP.DNS != "vpn.example.com" || typed.Spec.PersistentKeepalive != 25 {
			t.Errorf("decoded Peer: %+v", typed.Spec)
		}
		// Required fields are enforced by the schema, like Kilo's CRD.
		bad := &unstructured.Unstructured{}
		bad.SetAPIVersion("kilo.squat.ai/v1alpha1")
		bad.SetKind("Peer")
		bad.SetName("nokey")
		_ = unstructured.SetNestedStringSlice(bad.Object, []string{"10.6.0.1/32"}, "spec", "allowedIPs")
		if _, err := dyn.Resource(peersGVR).Create(ctx, bad, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
			t.Errorf("Peer without publicKey: err=%v, want Invalid", err)
		}
	})

	t.Run("ClusterMeshRoundTrip", func(t *testing.T) {
		in := `
apiVersion: kilo.squat.ai/v1alpha1
kind: ClusterMesh
metadata: {name: prod, namespace: kilo-system}
spec:
  clusters:
  - name: cluster-a
    local: true
    allowedNetworks: [10.1.0.0/16, 100.66.0.0/24, 10.96.0.0/12]
    wireguardPort: 51820
    persistentKeepalive: 10
  - name: cluster-b
    kubeconfigSecretRef: {name: cluster-b-kubeconfig, key: kubeconfig}
    allowedNetworks: [10.2.0.0/16, 100.66.1.0/24, 10.112.0.0/12]
    persistentKeepalive: 25
`
		ri := dyn.Resource(cmGVR).Namespace(ns)
		got := roundTrip(ctx, t, ri, in)
		var typed clustermesh.ClusterMesh
		assertSpecRoundTrip(t, in, got, &typed, func() any { return typed.Spec })

		// Status subresource: written through /status, ignored on the main
		// resource (so spec writers and status writers do not clobber each
		// other).
		status := map[string]any{
			"clusters": []any{map[string]any{"name": "cluster-b", "registeredPeers": int64(3), "skippedNodes": int64(1)}},
			"conditions": []any{map[string]any{"type": "Ready", "status": "True", "reason": "Synced", "message": "",
				"lastTransitionTime": "2026-01-01T00:00:00Z"}},
		}
		_ = unstructured.SetNestedField(got.Object, status, "status")
		upd, err := ri.UpdateStatus(ctx, got, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("update status: %v", err)
		}
		if !reflect.DeepEqual(upd.Object["status"], status) {
			t.Errorf("status read back %v, want %v", upd.Object["status"], status)
		}
		if err := json.Unmarshal(mustJSON(t, upd.Object), &typed); err != nil || typed.Status.Clusters[0].RegisteredPeers != 3 {
			t.Errorf("typed status: %+v, %v", typed.Status, err)
		}
		upd.Object["status"] = map[string]any{}
		again, err := ri.Update(ctx, upd, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(again.Object["status"], status) {
			t.Errorf("main resource update changed status to %v", again.Object["status"])
		}
	})

	t.Run("RBAC", func(t *testing.T) {
		// The shipped roles, bound to their shipped ServiceAccounts, with
		// real tokens (TokenRequest) as a user would put in a kubeconfig.
		if _, err := apiserver.ApplyObjects(ctx, admin, append(append([]*unstructured.Unstructured{}, local...), remote...), apiserver.ApplyOptions{}); err != nil {
			t.Fatalf("apply manifests: %v", err)
		}
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The agent's token as its pod on n1 has it: the admission policy
		// (components/admission) lets only such a token write n1.
		agentTok := podToken(ctx, t, cs, ns, "meshlet", "n1")
		remoteTok, err := srv.ServiceAccountToken(ctx, ns, "meshlet-remote")
		if err != nil {
			t.Fatal(err)
		}
		agent := kubernetes.NewForConfigOrDie(srv.TokenConfig(agentTok))
		remoteCS := kubernetes.NewForConfigOrDie(srv.TokenConfig(remoteTok))
		remoteDyn := dynamic.NewForConfigOrDie(srv.TokenConfig(remoteTok))
		agentDyn := dynamic.NewForConfigOrDie(srv.TokenConfig(agentTok))

		type check struct {
			verb, group, resource, namespace string
			allowed                          bool
		}
		sar := func(user string, c check) (bool, error) {
			r, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{
					User:   user,
					Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
					ResourceAttributes: &authorizationv1.ResourceAttributes{
						Verb: c.verb, Group: c.group, Resource: c.resource, Namespace: c.namespace,
					},
				},
			}, metav1.CreateOptions{})
			if err != nil {
				return false, err
			}
			return r.Status.Allowed, nil
		}
		cases := map[string][]check{
			"system:serviceaccount:kilo-system:meshlet-remote": {
				{"list", "", "nodes", "", true}, {"watch", "", "nodes", "", true}, {"get", "", "nodes", "", false},
				{"list", "kilo.squat.ai", "peers", "", true}, {"watch", "kilo.squat.ai", "peers", "", true},
				{"create", "", "nodes", "", false}, {"patch", "", "nodes", "", false}, {"update", "", "nodes", "", false},
				{"delete", "", "nodes", "", false}, {"patch", "", "nodes/status", "", false},
				{"create", "kilo.squat.ai", "peers", "", false}, {"patch", "kilo.squat.ai", "peers", "", false},
				{"delete", "kilo.squat.ai", "peers", "", false},
				{"get", "", "secrets", ns, false}, {"list", "", "secrets", "", false},
				{"list", "kilo.squat.ai", "clustermeshes", ns, false}, {"create", "", "events", "default", false},
			},
			"system:serviceaccount:kilo-system:meshlet": {
				{"list", "", "nodes", "", true}, {"get", "", "nodes", "", false}, {"watch", "", "nodes", "", true},
				{"patch", "", "nodes", "", true},
				{"list", "kilo.squat.ai", "peers", "", true}, {"watch", "kilo.squat.ai", "peers", "", true},
				{"create", "", "events", "default", true}, {"patch", "", "events", "default", true},
				{"create", "events.k8s.io", "events", "default", true},
				{"list", "kilo.squat.ai", "clustermeshes", ns, true}, {"watch", "kilo.squat.ai", "clustermeshes", ns, true},
				// No Secret until one is named (components/remote-secrets).
				{"list", "", "secrets", ns, false}, {"watch", "", "secrets", ns, false},
				// The ClusterMesh CRD's schema, read by the status writer; no
				// other CRD verb.
				{"get", "apiextensions.k8s.io", "customresourcedefinitions", "", true},
				{"list", "apiextensions.k8s.io", "customresourcedefinitions", "", false},
				{"update", "apiextensions.k8s.io", "customresourcedefinitions", "", false},
				// Secrets are watched by name, never read one by one.
				{"get", "", "secrets", ns, false},
				// Nothing outside its namespace, no writes beyond the above.
				{"get", "", "secrets", "other", false}, {"list", "", "secrets", "", false},
				{"list", "kilo.squat.ai", "clustermeshes", "other", false}, {"list", "kilo.squat.ai", "clustermeshes", "", false},
				{"create", "", "secrets", ns, false}, {"update", "", "secrets", ns, false},
				{"create", "", "nodes", "", false}, {"delete", "", "nodes", "", false}, {"update", "", "nodes/status", "", false},
				{"create", "kilo.squat.ai", "peers", "", false}, {"update", "kilo.squat.ai", "clustermeshes", ns, false},
			},
		}
		// The RBAC authorizer sees new bindings through an informer: wait
		// until the first grant of each user is visible (polling with a
		// deadline) before asserting, so a denial below is a real denial.
		for user, checks := range cases {
			deadline := time.Now().Add(15 * time.Second)
			for {
				allowed, err := sar(user, checks[0])
				if err != nil {
					t.Fatal(err)
				}
				if allowed {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: %+v never allowed", user, checks[0])
				}
				time.Sleep(50 * time.Millisecond) // poll interval
			}
		}
		for user, checks := range cases {
			for _, c := range checks {
				allowed, err := sar(user, c)
				if err != nil {
					t.Fatal(err)
				}
				if allowed != c.allowed {
					t.Errorf("%s: %s %s/%s in %q: allowed=%v, want %v", user, c.verb, c.group, c.resource, c.namespace, allowed, c.allowed)
				}
			}
		}

		// The same, with real calls through the tokens (authentication and
		// authorization end to end).
		mustOK := func(what string, err error) {
			t.Helper()
			if err != nil {
				t.Errorf("%s: %v", what, err)
			}
		}
		mustForbidden := func(what string, err error) {
			t.Helper()
			if !apierrors.IsForbidden(err) {
				t.Errorf("%s: err=%v, want Forbidden", what, err)
			}
		}
		_, err = remoteCS.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		mustOK("remote lists nodes", err)
		_, err = remoteDyn.Resource(peersGVR).List(ctx, metav1.ListOptions{})
		mustOK("remote lists peers", err)
		_, err = remoteCS.CoreV1().Nodes().Patch(ctx, "n1", types.MergePatchType, []byte(`{"metadata":{"annotations":{"x":"y"}}}`), metav1.PatchOptions{})
		mustForbidden("remote patches a node", err)
		err = remoteCS.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{})
		mustForbidden("remote deletes a node", err)
		_, err = remoteCS.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "evil"}}, metav1.CreateOptions{})
		mustForbidden("remote creates a node", err)
		err = remoteDyn.Resource(peersGVR).Delete(ctx, "laptop", metav1.DeleteOptions{})
		mustForbidden("remote deletes a peer", err)
		_, err = remoteCS.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
		mustForbidden("remote lists secrets", err)

		_, err = agent.CoreV1().Nodes().Patch(ctx, "n1", types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"kilo.squat.ai/key":"GY5aT1N9dTR/nJnT1N2f4ClZWVj0jOAld0r8ysWLyjg="}}}`), metav1.PatchOptions{})
		mustOK("agent patches its node's annotations", err)
		_, err = agent.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
		mustForbidden("agent lists secrets in kilo-system (none named)", err)
		_, err = agent.CoreV1().Secrets("other").List(ctx, metav1.ListOptions{})
		mustForbidden("agent lists secrets in another namespace", err)
		_, err = agent.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
		mustForbidden("agent lists secrets cluster-wide", err)
		_, err = agentDyn.Resource(cmGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
		mustOK("agent lists clustermeshes", err)
		_, err = agentDyn.Resource(peersGVR).List(ctx, metav1.ListOptions{})
		mustOK("agent lists peers", err)
		_, err = agent.EventsV1().Events("default").Create(ctx, &eventsv1.Event{
			ObjectMeta: metav1.ObjectMeta{Name: "n1.rejected"}, EventTime: metav1.NowMicro(),
			Regarding: corev1.ObjectReference{Kind: "Node", Name: "n1"}, Reason: "Rejected", Action: "Plan",
			ReportingController: "meshlet.io/agent", ReportingInstance: "meshlet-n1", Type: corev1.EventTypeWarning, Note: "test",
		}, metav1.CreateOptions{})
		mustOK("agent creates an event", err)
	})
}

func mustDS(t *testing.T, s string) *appsv1.DaemonSet {
	t.Helper()
	var ds appsv1.DaemonSet
	if err := json.Unmarshal([]byte(s), &ds); err != nil {
		t.Fatal(err)
	}
	return &ds
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// roundTrip creates the YAML object and reads it back from the server.
func roundTrip(ctx context.Context, t *testing.T, ri dynamic.ResourceInterface, in string) *unstructured.Unstructured {
	t.Helper()
	objs := decode(t, []byte(in))
	if _, err := ri.Create(ctx, objs[0], metav1.CreateOptions{}); err != nil {
		t.Fatalf("create: %v", err)
	}
	got, err := ri.Get(ctx, objs[0].GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	return got
}

// assertSpecRoundTrip checks that the server returned spec unchanged (no
// pruning, no defaulting) and that meshlet's Go type decodes it and encodes
// the same JSON again.
func assertSpecRoundTrip(t *testing.T, in string, got *unstructured.Unstructured, typed any, spec func() any) {
	t.Helper()
	sent := decode(t, []byte(in))[0]
	if !reflect.DeepEqual(normalize(t, sent.Object["spec"]), normalize(t, got.Object["spec"])) {
		t.Errorf("spec changed by the server:\nsent %v\ngot  %v", sent.Object["spec"], got.Object["spec"])
	}
	if err := json.Unmarshal(mustJSON(t, got.Object), typed); err != nil {
		t.Fatalf("decode into %T: %v", typed, err)
	}
	if a, b := normalize(t, spec()), normalize(t, got.Object["spec"]); !reflect.DeepEqual(a, b) {
		t.Errorf("%T spec does not round-trip:\ntyped  %v\nserver %v", typed, a, b)
	}
}

// normalize maps any JSON-able value to its generic JSON form (numbers as
// float64), so YAML-decoded, server-returned and typed values compare.
func normalize(t *testing.T, v any) any {
	t.Helper()
	var out any
	if err := json.Unmarshal(mustJSON(t, v), &out); err != nil {
		t.Fatal(err)
	}
	return out
}
