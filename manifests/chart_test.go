package manifests_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/meshlet/meshlet/e2e/apiserver"
)

// helmBin is the helm of hack/tools (hack/k8s/ensure.sh tools).
func helmBin(t *testing.T) string {
	t.Helper()
	tools, err := apiserver.ToolsDir()
	if err != nil {
		apiserver.SkipOrFail(t, "no tools dir (hack/k8s/ensure.sh tools): %v", err)
	}
	p := filepath.Join(tools, "helm")
	if _, err := os.Stat(p); err != nil {
		apiserver.SkipOrFail(t, "helm not built in %s (hack/k8s/ensure.sh tools): %v", tools, err)
	}
	return p
}

func helm(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return out
}

// byKey indexes objects by kind/namespace/name, as JSON-normal maps.
func byKey(t *testing.T, objs []*unstructured.Unstructured) map[string]any {
	t.Helper()
	m := map[string]any{}
	for _, o := range objs {
		b, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		k := o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
		if _, dup := m[k]; dup {
			t.Fatalf("%s twice", k)
		}
		m[k] = v
	}
	return m
}

// helmOnlyLabels are the recommended labels only Helm knows the values of
// (the release, the chart); manifests/ sets the others (name, component,
// part-of) itself.
var helmOnlyLabels = []string{"app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "helm.sh/chart"}

// withoutHelmLabels drops helmOnlyLabels from the objects' and their pod
// templates' labels, after checking that every object carries them.
func withoutHelmLabels(t *testing.T, objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		for _, path := range [][]string{{"metadata", "labels"}, {"spec", "template", "metadata", "labels"}} {
			labels, found, _ := unstructured.NestedStringMap(o.Object, path...)
			if !found && path[0] == "spec" {
				continue
			}
			for _, l := range helmOnlyLabels {
				if labels[l] == "" {
					t.Errorf("%s %s: %s has no %s", o.GetKind(), o.GetName(), strings.Join(path, "."), l)
				}
				delete(labels, l)
			}
			if err := unstructured.SetNestedStringMap(o.Object, labels, path...); err != nil {
				t.Fatal(err)
			}
		}
	}
	return objs
}

// withoutTestObjects drops the objects of helm test (component test: its
// ServiceAccount and roles; the pod is a hook, left out by --skip-tests),
// which kustomize has no counterpart of.
func withoutTestObjects(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetLabels()["app.kubernetes.io/component"] != "test" {
			out = append(out, o)
		}
	}
	return out
}

// sameObjects fails with the first differing object of two renders: the
// chart's (without the Helm-only labels and helm test's objects) and
// kustomize's.
func sameObjects(t *testing.T, what string, helmObjs, kustomizeObjs []*unstructured.Unstructured) {
	t.Helper()
	h, k := byKey(t, withoutHelmLabels(t, withoutTestObjects(helmObjs))), byKey(t, kustomizeObjs)
	var keys []string
	for key := range h {
		keys = append(keys, key)
	}
	for key := range k {
		if _, ok := h[key]; !ok {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	for _, key := range keys {
		if !reflect.DeepEqual(h[key], k[key]) {
			hj, _ := json.MarshalIndent(h[key], "", "  ")
			kj, _ := json.MarshalIndent(k[key], "", "  ")
			t.Errorf("%s: %s differs\nhelm:\n%s\nkustomize:\n%s", what, key, hj, kj)
		}
	}
}

// TestChartEqualsKustomize keeps manifests/chart and the kustomizations
// from drifting apart: the chart with default values renders exactly
// `kustomize build manifests/`; with the sidecar and KubePrism values it
// renders base + both components; with monitoring on, it adds exactly
// manifests/monitoring (where the cluster serves the Prometheus Operator's
// API). helm test's hooks are left out (--skip-tests: TestChartTestHook).
func TestChartEqualsKustomize(t *testing.T) {
	tmpl := func(set ...string) []*unstructured.Unstructured {
		args := []string{"template", "meshlet", "chart", "--namespace", ns, "--skip-tests",
			"--api-versions", "monitoring.coreos.com/v1/PodMonitor", "--api-versions", "monitoring.coreos.com/v1/PrometheusRule",
			"--api-versions", vapAPI}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		return decode(t, helm(t, args...))
	}
	sameObjects(t, "defaults vs manifests/", tmpl(), decode(t, kustomizeBuild(t, ".")))
	sameObjects(t, "sidecar+KubePrism vs testdata/talos-userspace",
		tmpl("wireguard.sidecar=true", "apiServer.host=127.0.0.1", "apiServer.port=7445"),
		decode(t, kustomizeBuild(t, "testdata/talos-userspace")))
	sameObjects(t, "kgKey vs testdata/kg-key", tmpl("kgKey=true"), decode(t, kustomizeBuild(t, "testdata/kg-key")))
	sameObjects(t, "remoteSecrets vs testdata/remote-secrets", tmpl("remoteSecrets={cluster-b-kubeconfig}"),
		decode(t, kustomizeBuild(t, "testdata/remote-secrets")))
	sameObjects(t, "admissionPolicy.enabled=false vs manifests/base", tmpl("admissionPolicy.enabled=false"), decode(t, kustomizeBuild(t, "base")))
	sameObjects(t, "monitoring vs manifests/ + manifests/monitoring",
		tmpl("monitoring.podMonitor.enabled=true", "monitoring.prometheusRule.enabled=true", "monitoring.grafanaDashboard.enabled=true"),
		append(decode(t, kustomizeBuild(t, ".")), decode(t, kustomizeBuild(t, "monitoring"))...))
	// Values of the same meaning as Cozystack's Kilo chart reach the flags.
	ds := find(tmpl("transitCIDR=10.99.0.0/16", "dualStackTransitCIDR=fd4b::/64", "meshGranularity=full", "compatibility=", "mtu=1380",
		"serviceCIDR=10.96.0.0/12", "clusterName=east", "image.tag=v9", "image.pullPolicy=IfNotPresent"), "DaemonSet", "meshlet")
	c, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	ctr := c[0].(map[string]any)
	args := strings.Join(toStrings(ctr["args"].([]any)), " ")
	for _, want := range []string{"--subnet=10.99.0.0/16", "--dual-stack-subnet=fd4b::/64", "--mesh-granularity=full", "--compatibility= ", "--mtu=1380",
		"--service-cidr=10.96.0.0/12", "--cluster-name=east"} {
		if !strings.Contains(args+" ", want) {
			t.Errorf("args %q lack %q", args, want)
		}
	}
	if ctr["image"] != "ghcr.io/meshlet/meshlet:v9" || ctr["imagePullPolicy"] != "IfNotPresent" {
		t.Errorf("image %v, pull policy %v", ctr["image"], ctr["imagePullPolicy"])
	}
	// The ClusterMesh value renders a ClusterMesh meshlet's types accept
	// (checked against the real CRD in TestInstallKeepsKiloObjects).
	cm := find(tmpl("clusterMesh.enabled=true", "clusterMesh.name=prod",
		"clusterMesh.clusters[0].name=a", "clusterMesh.clusters[0].local=true", "clusterMesh.clusters[0].allowedNetworks={10.1.0.0/16}",
		"clusterMesh.clusters[1].name=b", "clusterMesh.clusters[1].persistentKeepalive=25", "clusterMesh.clusters[1].allowedNetworks={10.2.0.0/16}",
		"clusterMesh.clusters[1].kubeconfigSecretRef.name=b-kubeconfig", "clusterMesh.clusters[1].kubeconfigSecretRef.key=kubeconfig"), "ClusterMesh", "prod")
	if cm == nil {
		t.Fatal("no ClusterMesh rendered")
	}
	cls, _, _ := unstructured.NestedSlice(cm.Object, "spec", "clusters")
	if len(cls) != 2 || fmt.Sprint(cls[1].(map[string]any)["persistentKeepalive"]) != "25" {
		t.Errorf("ClusterMesh clusters %v", cls)
	}
}

func toStrings(in []any) []string {
	out := make([]string, len(in))
	for i, v := range in {
		out[i] = v.(string)
	}
	return out
}

func TestHelmLint(t *testing.T) {
	for _, set := range [][]string{nil, {"--set", "wireguard.sidecar=true,privileged=false,monitoring.podMonitor.enabled=true,monitoring.prometheusRule.enabled=true,monitoring.grafanaDashboard.enabled=true,apiServer.host=127.0.0.1,apiServer.port=7445"},
		{"--set", "admissionPolicy.enabled=false"}} {
		out := helm(t, append([]string{"lint", "--strict", "chart"}, set...)...)
		if !bytes.Contains(out, []byte("0 chart(s) failed")) || bytes.Contains(out, []byte("[WARNING]")) || bytes.Contains(out, []byte("[ERROR]")) {
			t.Errorf("helm lint %v:\n%s", set, out)
		}
	}
}

// TestChartCopies: the chart's CRDs, alert rules and dashboard are copies (a chart
// cannot reach files outside its directory); they must stay byte-equal.
func TestChartCopies(t *testing.T) {
	for chart, src := range map[string]string{
		"chart/crds/peers.kilo.squat.ai.yaml":         "crds/peers.kilo.squat.ai.yaml",
		"chart/crds/clustermeshes.kilo.squat.ai.yaml": "crds/clustermeshes.kilo.squat.ai.yaml",
		"chart/files/rules.yaml":                      "monitoring/rules.yaml",
		"chart/files/dashboard.json":                  "monitoring/dashboard.json",
	} {
		a, err := os.ReadFile(chart)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s: cp %s %s", chart, src, src, chart)
		}
	}
}

// vapAPI is the kind the API server serves from Kubernetes 1.30 on, which
// the chart renders its admission policy for (helm template knows kinds
// only when told).
const vapAPI = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"

// TestChartAdmissionPolicy: the policy confining the agents to their nodes
// (docs/security.md#admission) is rendered by default where the API server
// serves it, for the release's namespace; not where it does not (before
// Kubernetes 1.30, or helm template not told), nor when
// admissionPolicy.enabled is false.
func TestChartAdmissionPolicy(t *testing.T) {
	const user = "system:serviceaccount:' + 'kilo-system' + ':' + 'meshlet'"
	for _, tc := range []struct {
		name string
		args []string
		user string // "" = no policy
	}{
		{"served", []string{"--api-versions", vapAPI}, user},
		{"in kube-system", []string{"--api-versions", vapAPI, "--namespace", "kube-system"}, "system:serviceaccount:' + 'kube-system' + ':' + 'meshlet'"},
		{"not served (before 1.30)", nil, ""},
		{"turned off", []string{"--api-versions", vapAPI, "--set", "admissionPolicy.enabled=false"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"template", "meshlet", "chart", "--namespace", ns, "--skip-tests"}, tc.args...)
			objs := decode(t, helm(t, args...))
			p, b := find(objs, "ValidatingAdmissionPolicy", "meshlet"), find(objs, "ValidatingAdmissionPolicyBinding", "meshlet")
			if tc.user == "" {
				if p != nil || b != nil {
					t.Errorf("policy %v, binding %v rendered, want none", p != nil, b != nil)
				}
				return
			}
			if p == nil || b == nil {
				t.Fatalf("policy %v, binding %v rendered, want both", p != nil, b != nil)
			}
			mcs, _, _ := unstructured.NestedSlice(p.Object, "spec", "matchConditions")
			if got := fmt.Sprint(mcs); !strings.Contains(got, "request.userInfo.username == '"+tc.user) {
				t.Errorf("matchConditions %s, want the user %s", got, tc.user)
			}
		})
	}
}
