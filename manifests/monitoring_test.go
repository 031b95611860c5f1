package manifests_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/VictoriaMetrics/metricsql"

	"github.com/meshlet/meshlet/e2e/apiserver"
	"github.com/meshlet/meshlet/e2e/harness"
)

// ruleObjects are the objects generated from monitoring/rules.yaml: each
// file's own head (apiVersion, kind, metadata) down to its line "spec:",
// then rules.yaml's groups indented under it. The chart's copy is the
// whole file (a chart cannot reach files outside its directory).
var ruleObjects = []string{
	"monitoring/prometheusrule.yaml",
	"monitoring/victoriametrics/vmrule.yaml",
	"monitoring/dropin/prometheusrule.yaml",
	"monitoring/dropin/victoriametrics/vmrule.yaml",
}

// rulesGroups is rules.yaml from its line "groups:" on: what every rule
// object carries under spec, comments included.
func rulesGroups(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("monitoring/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte("\ngroups:\n"))
	if i < 0 {
		t.Fatal(`monitoring/rules.yaml: no line "groups:"`)
	}
	return b[i+1:]
}

// generateRuleObject returns path's content with its spec made of groups.
func generateRuleObject(t *testing.T, path string, groups []byte) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte("\nspec:\n"))
	if i < 0 {
		t.Fatalf(`%s: no line "spec:" to generate the rules under`, path)
	}
	out := append([]byte(nil), b[:i+len("\nspec:\n")]...)
	for _, l := range bytes.SplitAfter(groups, []byte("\n")) {
		if len(bytes.TrimSpace(l)) > 0 {
			out = append(out, "  "...)
		}
		out = append(out, l...)
	}
	return out
}

// TestRuleObjects: one source of the alerts, rules.yaml (what promtool and
// make e2e test), and the objects that carry it — the PrometheusRule and
// the VMRule of meshlet's DaemonSet and of the drop-in, and the chart's
// copy — generated from it, byte for byte (-update writes them), and each
// with rules.yaml's groups once parsed.
func TestRuleObjects(t *testing.T) {
	groups := rulesGroups(t)
	var src map[string]any
	mustYAML(t, "monitoring/rules.yaml", &src)
	check := func(path string, want []byte) {
		t.Helper()
		if *update {
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is not generated from monitoring/rules.yaml (go test ./manifests -run TestRuleObjects -update)", path)
		}
	}
	kinds := map[string]string{}
	for _, path := range ruleObjects {
		check(path, generateRuleObject(t, path, groups))
		var obj map[string]any
		mustYAML(t, path, &obj)
		spec, _ := obj["spec"].(map[string]any)
		if !reflect.DeepEqual(spec["groups"], src["groups"]) {
			t.Errorf("%s: spec.groups differ from monitoring/rules.yaml's groups", path)
		}
		kinds[path] = obj["apiVersion"].(string) + " " + obj["kind"].(string)
	}
	src0, err := os.ReadFile("monitoring/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	check("chart/files/rules.yaml", src0)
	for path, want := range map[string]string{
		"monitoring/prometheusrule.yaml":                "monitoring.coreos.com/v1 PrometheusRule",
		"monitoring/dropin/prometheusrule.yaml":         "monitoring.coreos.com/v1 PrometheusRule",
		"monitoring/victoriametrics/vmrule.yaml":        "operator.victoriametrics.com/v1beta1 VMRule",
		"monitoring/dropin/victoriametrics/vmrule.yaml": "operator.victoriametrics.com/v1beta1 VMRule",
	} {
		if kinds[path] != want {
			t.Errorf("%s: %s, want %s", path, kinds[path], want)
		}
	}
}

// kiloPods are the labels and port of the pods of Kilo's DaemonSet kilo as
// Kilo's manifests (kube-system) and Cozystack's chart (cozy-kilo) write
// them, the shapes e2e/node/kgshape_test.go runs: what the drop-in's scrape
// objects must select.
var kiloPods = struct {
	labels     map[string]string
	port       string
	namespaces []string
}{map[string]string{"app.kubernetes.io/name": "kilo", "app.kubernetes.io/part-of": "kilo"}, "metrics", []string{"kube-system", "cozy-kilo"}}

// scrape is what a PodMonitor or a VMPodScrape asks for, in one form.
type scrape struct {
	Job        string
	Namespaces []string
	Selector   map[string]string
	Port, Path string
	Interval   string
	Relabel    []any
}

func scrapeOf(t *testing.T, o *unstructured.Unstructured, podLabels map[string]string) scrape {
	t.Helper()
	var s scrape
	jobLabel, _, _ := unstructured.NestedString(o.Object, "spec", "jobLabel")
	s.Job = podLabels[jobLabel]
	s.Namespaces, _, _ = unstructured.NestedStringSlice(o.Object, "spec", "namespaceSelector", "matchNames")
	if len(s.Namespaces) == 0 {
		s.Namespaces = []string{o.GetNamespace()}
	}
	s.Selector, _, _ = unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels")
	eps, _, _ := unstructured.NestedSlice(o.Object, "spec", "podMetricsEndpoints")
	if len(eps) != 1 {
		t.Fatalf("%s %s: %d endpoints, want 1", o.GetKind(), o.GetName(), len(eps))
	}
	ep := eps[0].(map[string]any)
	s.Port, _ = ep["port"].(string)
	s.Path, _ = ep["path"].(string)
	s.Interval, _ = ep["interval"].(string)
	// The Prometheus Operator calls them relabelings, VictoriaMetrics'
	// relabelConfigs; the same relabeling either way.
	key := map[string]string{"PodMonitor": "relabelings", "VMPodScrape": "relabelConfigs"}[o.GetKind()]
	for k := range ep {
		if strings.Contains(strings.ToLower(k), "relabel") && k != key {
			t.Errorf("%s %s: %s is not a field of a %s (%s is)", o.GetKind(), o.GetName(), k, o.GetKind(), key)
		}
	}
	s.Relabel, _ = ep[key].([]any)
	return s
}

// TestMonitoringObjects: the scrape objects select what they are for — the
// drop-in's the pods of Kilo's DaemonSet in both places Kilo is installed
// from, under job kilo; meshlet's its own pods under job meshlet — and the
// PodMonitor and the VMPodScrape of each ask for the same scrape.
func TestMonitoringObjects(t *testing.T) {
	meshletPods := map[string]string{}
	for _, o := range decode(t, kustomizeBuild(t, ".")) {
		if o.GetKind() == "DaemonSet" {
			meshletPods, _, _ = unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "labels")
		}
	}
	for _, tt := range []struct {
		dirs      [2]string // Prometheus Operator, VictoriaMetrics' operator
		name, job string
		pods      map[string]string
		in        []string
	}{
		{[2]string{"monitoring", "monitoring/victoriametrics"}, "meshlet", "meshlet", meshletPods, []string{"kilo-system"}},
		{[2]string{"monitoring/dropin", "monitoring/dropin/victoriametrics"}, "meshlet-dropin", "kilo", kiloPods.labels, kiloPods.namespaces},
	} {
		var scrapes []scrape
		for i, dir := range tt.dirs {
			objs := decode(t, kustomizeBuild(t, dir))
			kinds := [][2]string{{"PodMonitor", "PrometheusRule"}, {"VMPodScrape", "VMRule"}}[i]
			for _, k := range kinds {
				if find(objs, k, tt.name) == nil {
					t.Errorf("kustomize build %s: no %s %s", dir, k, tt.name)
				}
			}
			sc := find(objs, kinds[0], tt.name)
			if sc == nil {
				continue
			}
			s := scrapeOf(t, sc, tt.pods)
			scrapes = append(scrapes, s)
			for k, v := range s.Selector {
				if tt.pods[k] != v {
					t.Errorf("%s %s selects %s=%s, the pods have %v", kinds[0], tt.name, k, v, tt.pods)
				}
			}
			if len(s.Selector) == 0 {
				t.Errorf("%s %s selects every pod", kinds[0], tt.name)
			}
			if !reflect.DeepEqual(s.Namespaces, tt.in) {
				t.Errorf("%s %s looks in %v, want %v", kinds[0], tt.name, s.Namespaces, tt.in)
			}
			if s.Job != tt.job || s.Port != kiloPods.port || s.Path != "/metrics" {
				t.Errorf("%s %s: job %q, port %q, path %q; want job %q, port %q, /metrics", kinds[0], tt.name, s.Job, s.Port, s.Path, tt.job, kiloPods.port)
			}
			if !strings.Contains(jsonOf(s.Relabel), `"targetLabel":"node"`) {
				t.Errorf("%s %s: no node label per target: %v", kinds[0], tt.name, s.Relabel)
			}
		}
		if len(scrapes) == 2 && !reflect.DeepEqual(scrapes[0], scrapes[1]) {
			t.Errorf("%s: the PodMonitor and the VMPodScrape differ:\n%+v\n%+v", tt.name, scrapes[0], scrapes[1])
		}
	}
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// monitoringSchemas stand in for the operators' CRDs (large, not vendored
// here) with the fields of theirs the shipped objects use, typed, and no
// other: a strict server-side apply rejects a field of the other operator
// (relabelings in a VMPodScrape) or a misspelt one. The fields are the
// operators' API types: monitoring.coreos.com/v1 PodMonitorSpec and
// PrometheusRuleSpec; operator.victoriametrics.com/v1beta1 VMPodScrapeSpec,
// RelabelConfig and VMRuleSpec.
const monitoringSchemas = `
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
            properties:
              jobLabel: {type: string}
              namespaceSelector: NSS
              selector: SEL
              podMetricsEndpoints:
                type: array
                items:
                  type: object
                  properties:
                    port: {type: string}
                    path: {type: string}
                    interval: {type: string}
                    scrapeTimeout: {type: string}
                    relabelings: RELABEL
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
          spec: RULESPEC
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: vmpodscrapes.operator.victoriametrics.com}
spec:
  group: operator.victoriametrics.com
  names: {kind: VMPodScrape, plural: vmpodscrapes, singular: vmpodscrape}
  scope: Namespaced
  versions:
  - name: v1beta1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [podMetricsEndpoints]
            properties:
              jobLabel: {type: string}
              namespaceSelector: NSS
              selector: SEL
              podMetricsEndpoints:
                type: array
                items:
                  type: object
                  properties:
                    port: {type: string}
                    path: {type: string}
                    interval: {type: string}
                    scrapeTimeout: {type: string}
                    relabelConfigs: RELABEL
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: vmrules.operator.victoriametrics.com}
spec:
  group: operator.victoriametrics.com
  names: {kind: VMRule, plural: vmrules, singular: vmrule}
  scope: Namespaced
  versions:
  - name: v1beta1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        required: [spec]
        properties:
          spec: RULESPEC
`

// The parts of monitoringSchemas both operators share, in flow style.
var schemaParts = strings.NewReplacer(
	"NSS", `{type: object, properties: {any: {type: boolean}, matchNames: {type: array, items: {type: string}}}}`,
	"SEL", `{type: object, properties: {matchLabels: {type: object, additionalProperties: {type: string}}}}`,
	"RELABEL", `{type: array, items: {type: object, properties: {sourceLabels: {type: array, items: {type: string}},
    targetLabel: {type: string}, regex: {type: string}, replacement: {type: string}, action: {type: string}, separator: {type: string}}}}`,
	"RULESPEC", `{type: object, properties: {groups: {type: array, items: {type: object, required: [name, rules],
    properties: {name: {type: string}, interval: {type: string}, rules: {type: array, items: {type: object, required: [expr],
    properties: {alert: {type: string}, record: {type: string}, expr: {type: string}, for: {type: string},
    labels: {type: object, additionalProperties: {type: string}}, annotations: {type: object, additionalProperties: {type: string}}}}}}}}}}`)

// TestMonitoringOnAPIServer: every monitoring object (meshlet's and the
// drop-in's, for both operators) passes a strict server-side dry-run
// against its operator's schema as monitoringSchemas states it; a
// PodMonitor's field in a VMPodScrape does not.
func TestMonitoringOnAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := apiserver.Start(t, apiserver.Options{})
	admin := srv.AdminConfig()
	if _, err := apiserver.Apply(ctx, admin, []byte(schemaParts.Replace(monitoringSchemas)+"\n---\n"+
		"{apiVersion: v1, kind: Namespace, metadata: {name: kilo-system}}\n"), apiserver.ApplyOptions{}); err != nil {
		t.Fatalf("schemas: %v", err)
	}
	dyn := dynamic.NewForConfigOrDie(admin)
	apply := func(o *unstructured.Unstructured) error {
		gv, err := schema.ParseGroupVersion(o.GetAPIVersion())
		if err != nil {
			return err
		}
		gvr := gv.WithResource(strings.ToLower(o.GetKind()) + "s")
		var ri dynamic.ResourceInterface = dyn.Resource(gvr)
		if o.GetNamespace() != "" {
			ri = dyn.Resource(gvr).Namespace(o.GetNamespace())
		}
		b, err := json.Marshal(o.Object)
		if err != nil {
			return err
		}
		force := true
		_, err = ri.Patch(ctx, o.GetName(), types.ApplyPatchType, b, metav1.PatchOptions{FieldManager: "meshlet-test",
			Force: &force, DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"})
		return err
	}
	n := 0
	for _, dir := range []string{"monitoring", "monitoring/victoriametrics", "monitoring/dropin", "monitoring/dropin/victoriametrics"} {
		for _, o := range decode(t, kustomizeBuild(t, dir)) {
			if o.GetKind() == "ConfigMap" {
				continue
			}
			if err := apply(o); err != nil {
				t.Errorf("%s: %s %s: %v", dir, o.GetKind(), o.GetName(), err)
			}
			n++
		}
	}
	if n != 8 {
		t.Errorf("%d scrape and rule objects, want 8", n)
	}
	var wrong unstructured.Unstructured
	if err := yaml.Unmarshal([]byte(`{apiVersion: operator.victoriametrics.com/v1beta1, kind: VMPodScrape,
metadata: {name: wrong, namespace: kube-system},
spec: {selector: {matchLabels: {a: b}}, podMetricsEndpoints: [{port: metrics, relabelings: [{targetLabel: node}]}]}}`), &wrong.Object); err != nil {
		t.Fatal(err)
	}
	if err := apply(&wrong); err == nil || !strings.Contains(err.Error(), "relabelings") {
		t.Errorf("a VMPodScrape with a PodMonitor's relabelings: %v, want it refused naming the field", err)
	}
}

// TestVMRuleMetricsQL: every expression of the VMRules parses as MetricsQL,
// the language vmalert evaluates them in (promtool checks them as PromQL:
// TestPromtool), and so does every query of the dashboard, which a
// VictoriaMetrics data source answers in it.
func TestVMRuleMetricsQL(t *testing.T) {
	var exprs []string
	for _, path := range ruleObjects {
		var obj struct {
			Spec struct {
				Groups []struct {
					Rules []struct {
						Alert, Expr string
					} `json:"rules"`
				} `json:"groups"`
			} `json:"spec"`
		}
		mustYAML(t, path, &obj)
		for _, g := range obj.Spec.Groups {
			for _, r := range g.Rules {
				exprs = append(exprs, r.Expr)
			}
		}
	}
	qs, err := harness.DashboardQueries("monitoring/dashboard.json", map[string]string{"cluster": ".*", "node": ".*", "__rate_interval": "5m"})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		exprs = append(exprs, q.Expr)
	}
	for _, e := range exprs {
		if _, err := metricsql.Parse(e); err != nil {
			t.Errorf("not MetricsQL: %v\n%s", err, e)
		}
	}
	if len(exprs) < 8*len(ruleObjects) {
		t.Errorf("%d expressions read, want the 8 alerts of each rule object and the dashboard's", len(exprs))
	}
}
