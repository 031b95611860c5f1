package clustermesh

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/meshlet/meshlet/agent/core/topology"
)

const (
	meshletCRD  = "../../../manifests/crds/clustermeshes.kilo.squat.ai.yaml"
	operatorCRD = "../../../manifests/testdata/kilo-clustermesh-operator/kilo.squat.ai_clustermeshes.yaml"
)

func crdJSON(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// crd wraps a status schema (JSON) into a CRD of version v1alpha1; root
// is the rest of openAPIV3Schema's top level.
func crd(status, root string) []byte {
	props := `"spec":{"type":"object"}`
	if status != "" {
		props += `,"status":` + status
	}
	if root != "" {
		root = "," + root
	}
	return []byte(`{"spec":{"versions":[{"name":"v1beta1"},{"name":"v1alpha1","schema":{"openAPIV3Schema":{"type":"object","properties":{` + props + `}` + root + `}}}]}}`)
}

var (
	allFields = []string{"clusters[].message", "clusters[].name", "clusters[].nodes", "clusters[].peers", "clusters[].ready",
		"clusters[].registeredPeers", "clusters[].skippedNodes", "clusters[].synced",
		"conditions[].lastTransitionTime", "conditions[].message", "conditions[].observedGeneration", "conditions[].reason",
		"conditions[].status", "conditions[].type", "readyClusters"}
	commonFields = []string{"clusters[].name", "clusters[].registeredPeers", "clusters[].skippedNodes",
		"conditions[].lastTransitionTime", "conditions[].message", "conditions[].observedGeneration", "conditions[].reason",
		"conditions[].status", "conditions[].type"}
)

// TestStatusSchema walks CRDs down to the schema of status: meshlet's keeps
// every field meshlet writes, the operator's the fields both have (which is
// CommonStatus), and the structural-schema rules decide the rest.
func TestStatusSchema(t *testing.T) {
	tests := []struct {
		name string
		crd  []byte
		want []string // KeptFields
		err  string
	}{
		{name: "meshlet's CRD: everything", crd: crdJSON(t, meshletCRD), want: allFields},
		{name: "the operator's CRD: clusters' name, registeredPeers, skippedNodes; conditions", crd: crdJSON(t, operatorCRD), want: commonFields},
		{name: "status preserves unknown fields", crd: crd(`{"type":"object","x-kubernetes-preserve-unknown-fields":true}`, ""), want: allFields},
		{name: "unknown fields preserved in cluster entries only",
			crd: crd(`{"type":"object","properties":{"clusters":{"type":"array","items":{"type":"object","x-kubernetes-preserve-unknown-fields":true,"properties":{"name":{"type":"string"}}}}}}`, ""),
			want: []string{"clusters[].message", "clusters[].name", "clusters[].nodes", "clusters[].peers", "clusters[].ready",
				"clusters[].registeredPeers", "clusters[].skippedNodes", "clusters[].synced"}},
		{name: "additionalProperties: true", crd: crd(`{"type":"object","additionalProperties":true}`, ""), want: allFields},
		// Pruning is not validation: readyClusters, a string, stays (the API
		// server would refuse it, not drop it).
		{name: "additionalProperties with a schema (each key pruned by it)",
			crd:  crd(`{"type":"object","additionalProperties":{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"},"type":{"type":"string"}}}}}`, ""),
			want: []string{"clusters[].name", "conditions[].type", "readyClusters"}},
		{name: "no status, unknown fields preserved at the top", crd: crd("", `"x-kubernetes-preserve-unknown-fields":true`), want: allFields},
		{name: "no status: nothing kept", crd: crd("", ""), want: nil},
		{name: "status without properties: nothing kept", crd: crd(`{"type":"object"}`, ""), want: nil},
		{name: "no v1alpha1", crd: []byte(`{"spec":{"versions":[{"name":"v1"}]}}`), err: "no version v1alpha1"},
		{name: "v1alpha1 without schema", crd: []byte(`{"spec":{"versions":[{"name":"v1alpha1"}]}}`), err: "no openAPIV3Schema"},
		{name: "not JSON", crd: []byte(`{`), err: "decoding the CRD"},
		{name: "additionalProperties of a wrong type", crd: crd(`{"type":"object","additionalProperties":"x"}`, ""), err: "additionalProperties"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := StatusSchema(tt.crd)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := KeptFields(s); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("kept %v, want %v", got, tt.want)
			}
		})
	}
	if got := KeptFields(CommonStatus); !reflect.DeepEqual(got, commonFields) {
		t.Errorf("CommonStatus keeps %v, want %v", got, commonFields)
	}
	if got := KeptFields(KeepAll); !reflect.DeepEqual(got, allFields) {
		t.Errorf("KeepAll keeps %v, want %v", got, allFields)
	}
}

func TestPrune(t *testing.T) {
	obj := func(props map[string]*Schema) *Schema { return &Schema{Type: "object", Properties: props} }
	str := &Schema{Type: "string"}
	tests := []struct {
		name   string
		in     string
		schema *Schema
		want   string
	}{
		{"nil schema keeps all", `{"a":{"b":1}}`, nil, `{"a":{"b":1}}`},
		{"unknown keys dropped, nested too", `{"a":"x","b":{"c":1,"d":2},"e":[1]}`, obj(map[string]*Schema{"a": str, "b": obj(map[string]*Schema{"c": {Type: "integer"}})}), `{"a":"x","b":{"c":1}}`},
		{"array items pruned one by one", `[{"a":1,"b":2},{"b":3}]`, &Schema{Type: "array", Items: obj(map[string]*Schema{"a": {Type: "integer"}})}, `[{"a":1},{}]`},
		{"array without items schema kept", `[{"a":1}]`, &Schema{Type: "array"}, `[{"a":1}]`},
		{"preserve with properties: declared ones pruned, others kept", `{"a":{"x":1,"y":2},"z":3}`,
			&Schema{Type: "object", PreserveUnknown: true, Properties: map[string]*Schema{"a": obj(map[string]*Schema{"x": {Type: "integer"}})}}, `{"a":{"x":1},"z":3}`},
		{"scalars kept", `"s"`, str, `"s"`},
		{"null kept", `{"a":null}`, obj(map[string]*Schema{"a": str}), `{"a":null}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var in, want any
			if err := json.Unmarshal([]byte(tt.in), &in); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(tt.want), &want); err != nil {
				t.Fatal(err)
			}
			if got := Prune(in, tt.schema); !reflect.DeepEqual(got, want) {
				t.Errorf("Prune = %v, want %v", got, want)
			}
		})
	}
}

// TestProjectStatus: what the writer applies under each CRD, for a status
// BuildStatus made.
func TestProjectStatus(t *testing.T) {
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	m := &ClusterMesh{ObjectMeta: metav1.ObjectMeta{Namespace: "kilo-system", Name: "prod", Generation: 2}, Spec: ClusterMeshSpec{Clusters: []Cluster{
		{Name: "a", Local: true}, {Name: "b"},
	}}}
	st := BuildStatus(m, "", map[string]RemoteState{"b": {Watched: true, Synced: true, Ready: true, Nodes: 3, Peers: 1, Leaders: 2}},
		[]topology.Rejection{{Object: topology.ObjectRef{Kind: "Node", Cluster: "b", Name: "b-9"}, Reason: topology.ReasonNoPublicKey}}, now)
	conds := `[{"type":"NetworksOverlap","status":"False","observedGeneration":2,"lastTransitionTime":"2026-12-01T03:00:00Z","reason":"NoOverlap","message":"no networks overlap"},` +
		`{"type":"Ready","status":"True","observedGeneration":2,"lastTransitionTime":"2026-12-01T03:00:00Z","reason":"ClustersReady","message":"1 remote clusters synced and reachable"}]`
	for _, tt := range []struct {
		name string
		crd  []byte
		want string
	}{
		{"meshlet's CRD", crdJSON(t, meshletCRD),
			`{"readyClusters":"1/1","clusters":[{"name":"b","registeredPeers":2,"skippedNodes":1,"synced":true,"ready":true,"nodes":3,"peers":1}],"conditions":` + conds + `}`},
		{"the operator's CRD", crdJSON(t, operatorCRD),
			`{"clusters":[{"name":"b","registeredPeers":2,"skippedNodes":1}],"conditions":` + conds + `}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := StatusSchema(tt.crd)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ProjectStatus(st, s)
			if err != nil {
				t.Fatal(err)
			}
			var want map[string]any
			if err := json.Unmarshal([]byte(tt.want), &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				g, _ := json.Marshal(got)
				t.Errorf("projected\n%s\nwant\n%s", g, tt.want)
			}
		})
	}
	if got, err := ProjectStatus(ClusterMeshStatus{}, CommonStatus); err != nil || len(got) != 0 {
		t.Errorf("empty status projected to %v (%v)", got, err)
	}
}
