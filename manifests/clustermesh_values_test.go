package manifests_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
)

// shape is a JSON schema reduced to what decides whether a value decodes
// into a Go type: its type, its items' shape, its properties' shapes.
type shape struct {
	Type       string            `json:"type,omitempty"`
	Items      *shape            `json:"items,omitempty"`
	Properties map[string]*shape `json:"properties,omitempty"`
	Required   []string          `json:"required,omitempty"`
}

// shapeOf is the shape of Go type t as encoding/json reads it.
func shapeOf(t reflect.Type) *shape {
	switch t.Kind() {
	case reflect.Pointer:
		return shapeOf(t.Elem())
	case reflect.String:
		return &shape{Type: "string"}
	case reflect.Bool:
		return &shape{Type: "boolean"}
	case reflect.Int, reflect.Int32, reflect.Int64, reflect.Uint16, reflect.Uint32:
		return &shape{Type: "integer"}
	case reflect.Slice:
		return &shape{Type: "array", Items: shapeOf(t.Elem())}
	case reflect.Struct:
		s := &shape{Type: "object", Properties: map[string]*shape{}}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" || !f.IsExported() {
				continue
			}
			s.Properties[name] = shapeOf(f.Type)
		}
		return s
	}
	panic("shapeOf: no JSON schema type for " + t.String())
}

// withoutRequired drops Required at every level (compared separately).
func withoutRequired(s *shape) *shape {
	if s == nil {
		return nil
	}
	out := &shape{Type: s.Type, Items: withoutRequired(s.Items)}
	if s.Properties != nil {
		out.Properties = map[string]*shape{}
		for k, v := range s.Properties {
			out.Properties[k] = withoutRequired(v)
		}
	}
	return out
}

// chartEntrySchema is values.schema.json's schema of one clusterMesh entry.
func chartEntrySchema(t *testing.T) *shape {
	t.Helper()
	var schema struct {
		Properties struct {
			ClusterMesh struct {
				Properties struct {
					Clusters struct {
						Items *shape `json:"items"`
					} `json:"clusters"`
				} `json:"properties"`
			} `json:"clusterMesh"`
		} `json:"properties"`
	}
	b, err := os.ReadFile(filepath.Join("chart", "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	return schema.Properties.ClusterMesh.Properties.Clusters.Items
}

// crdEntrySchema is the schema of one spec.clusters entry in a ClusterMesh
// CRD file.
func crdEntrySchema(t *testing.T, path string) *shape {
	t.Helper()
	var crd struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema struct {
						Properties struct {
							Spec struct {
								Properties struct {
									Clusters struct {
										Items *shape `json:"items"`
									} `json:"clusters"`
								} `json:"properties"`
							} `json:"spec"`
						} `json:"properties"`
					} `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	mustYAML(t, path, &crd)
	return crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties.Spec.Properties.Clusters.Items
}

func dump(s *shape) string {
	if s == nil {
		return "nothing"
	}
	b, _ := json.Marshal(s)
	return string(b)
}

// TestChartSchemaFollowsClusterMeshTypes: values.schema.json accepts, for
// an entry of clusterMesh.clusters, exactly the fields of the Go type meshlet
// decodes it into (agent/core/clustermesh.Cluster; the operator's typed form
// and 0.6's), each of its JSON type, and requires what the CRD generated
// from that type requires. So an entry the chart renders always decodes,
// and a field the type gains fails here until the chart's schema has it
// (it failed when the schema lacked podCIDRs, wireguardCIDR, serviceCIDR,
// additionalCIDRs). Every field of kilo-clustermesh-operator's CRD is one of
// them.
func TestChartSchemaFollowsClusterMeshTypes(t *testing.T) {
	chart := chartEntrySchema(t)
	if chart == nil {
		t.Fatal("values.schema.json has no schema for clusterMesh.clusters items")
	}
	want := shapeOf(reflect.TypeOf(clustermesh.Cluster{}))
	got := withoutRequired(chart)
	for name, w := range want.Properties {
		if g := got.Properties[name]; !reflect.DeepEqual(g, w) {
			t.Errorf("clusterMesh entry field %s: values.schema.json has %s, clustermesh.Cluster %s", name, dump(g), dump(w))
		}
	}
	for name := range got.Properties {
		if want.Properties[name] == nil {
			t.Errorf("clusterMesh entry field %s: in values.schema.json, not in clustermesh.Cluster", name)
		}
	}
	if got.Type != want.Type {
		t.Errorf("clusterMesh entry: type %q, want %q", got.Type, want.Type)
	}
	crd := crdEntrySchema(t, filepath.Join("crds", "clustermeshes.kilo.squat.ai.yaml"))
	for _, c := range []struct {
		what       string
		chart, crd *shape
	}{{"entry", chart, crd}, {"kubeconfigSecretRef", chart.Properties["kubeconfigSecretRef"], crd.Properties["kubeconfigSecretRef"]}} {
		if c.chart == nil || c.crd == nil {
			t.Errorf("%s: missing in the chart's schema or the CRD", c.what)
			continue
		}
		a, b := append([]string(nil), c.chart.Required...), append([]string(nil), c.crd.Required...)
		sort.Strings(a)
		sort.Strings(b)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: values.schema.json requires %v, the CRD generated from clustermesh.Cluster %v", c.what, a, b)
		}
	}
	op := crdEntrySchema(t, filepath.Join("testdata", "kilo-clustermesh-operator", "kilo.squat.ai_clustermeshes.yaml"))
	for name, s := range op.Properties {
		if got := chart.Properties[name]; got == nil || !reflect.DeepEqual(withoutRequired(got), withoutRequired(s)) {
			t.Errorf("kilo-clustermesh-operator's field %s (%s): the chart's schema has %s", name, dump(withoutRequired(s)), dump(withoutRequired(got)))
		}
	}
}

// TestChartClusterMeshValues: a clusterMesh in kilo-clustermesh-operator's
// typed form and one in the form only meshlet's CRD keeps (0.6's
// allowedNetworks, both forms in an entry, persistentKeepalive, a Secret
// reference without key) pass `helm lint --strict`, and the ClusterMesh the
// chart renders from each decodes into meshlet's types without an unknown
// field, is a mesh meshlet accepts (clustermesh.Resolve: no rejection), and
// has its kubeconfig Secrets granted by name. (The typed form failed lint:
// the schema lacked podCIDRs, wireguardCIDR and serviceCIDR.)
func TestChartClusterMeshValues(t *testing.T) {
	for _, tc := range []struct {
		file     string
		networks map[string]int // networks of each cluster, as meshlet adds them up
		secret   string
	}{
		{"clustermesh-operator.yaml", map[string]int{"cluster-a": 5, "cluster-b": 2}, "cluster-b-kubeconfig"},
		{"clustermesh-meshlet.yaml", map[string]int{"cluster-a": 3, "cluster-b": 3}, "cluster-b-kubeconfig"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			f := filepath.Join("testdata", "values", tc.file)
			out := helm(t, "lint", "--strict", "chart", "-f", f)
			if bytes.Contains(out, []byte("[WARNING]")) || bytes.Contains(out, []byte("[ERROR]")) {
				t.Errorf("helm lint --strict -f %s:\n%s", f, out)
			}
			objs := decode(t, helm(t, "template", "meshlet", "chart", "--namespace", ns, "-f", f))
			var cm *clustermesh.ClusterMesh
			for _, o := range objs {
				if o.GetKind() != "ClusterMesh" {
					continue
				}
				b, err := json.Marshal(o.Object)
				if err != nil {
					t.Fatal(err)
				}
				cm = new(clustermesh.ClusterMesh)
				dec := json.NewDecoder(bytes.NewReader(b))
				dec.DisallowUnknownFields()
				if err := dec.Decode(cm); err != nil {
					t.Fatalf("the rendered ClusterMesh does not decode into meshlet's types: %v\n%s", err, b)
				}
			}
			if cm == nil {
				t.Fatal("no ClusterMesh rendered")
			}
			res := clustermesh.Resolve([]*clustermesh.ClusterMesh{cm}, "")
			if len(res.Rejections) > 0 || len(res.Meshes) != 1 {
				t.Fatalf("meshlet rejects the rendered ClusterMesh: %+v", res.Rejections)
			}
			got := map[string]int{}
			for _, c := range res.Meshes[0].Clusters {
				got[c.Name] = len(c.AllowedNetworks)
			}
			if !reflect.DeepEqual(got, tc.networks) {
				t.Errorf("networks per cluster as meshlet reads them: %v, want %v", got, tc.networks)
			}
			if rules := fmt.Sprint(find(objs, "Role", "meshlet").Object["rules"]); !strings.Contains(rules, "resourceNames:["+tc.secret+"] resources:[secrets]") {
				t.Errorf("the Role does not grant %s by name: %s", tc.secret, rules)
			}
		})
	}
}
