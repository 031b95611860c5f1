package manifests_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/e2e/apiserver"
)

// operatorCRD is kilo-clustermesh-operator's ClusterMesh CRD (test data, see
// its header).
const operatorCRD = "testdata/kilo-clustermesh-operator/kilo.squat.ai_clustermeshes.yaml"

// TestCRDsAgree creates ClusterMeshes (server-side dry-run: as they would be
// stored) under the operator's CRD and under meshlet's in turn, on a real
// API server. Every object the operator's CRD accepts, meshlet's accepts too,
// and meshlet reads both stored objects the same way; meshlet's stores what
// was sent (nothing pruned or defaulted). Where meshlet's accepts more — 0.6's
// form, values the operator's patterns, ranges and required fields refuse —
// meshlet's own validation refuses the value or gives it the meaning
// written here (docs/clustermesh.md, "Two schemas").
func TestCRDsAgree(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv := apiserver.Start(t, apiserver.Options{})
	admin := srv.AdminConfig()
	cs := kubernetes.NewForConfigOrDie(admin)
	dyn := dynamic.NewForConfigOrDie(admin)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	const a = `{name: a, local: true, podCIDRs: [10.1.0.0/16], wireguardCIDR: 100.66.0.0/24}`
	const ref = `kubeconfigSecretRef: {name: b-kubeconfig, key: kubeconfig}`
	cases := []struct {
		name     string
		clusters string // YAML of spec.clusters
		operator bool   // the operator's CRD accepts it
		// pruned: the operator's CRD drops fields it lacks (0.6's), so
		// meshlet reads the two stored objects differently.
		pruned bool
		// meshlet's validation of it: "" valid, else the field it rejects.
		meshlet string
	}{
		{name: "the operator's minimal example", operator: true, clusters: `
- {name: cluster-a, local: true, podCIDRs: [10.244.0.0/16], wireguardCIDR: 100.64.0.0/16}
- {name: cluster-b, kubeconfigSecretRef: {name: cluster-b-kubeconfig, key: kubeconfig}, podCIDRs: [10.245.0.0/16], wireguardCIDR: 100.65.0.0/16}`},
		{name: "the operator's full example", operator: true, clusters: `
- {name: cluster-a, local: true, podCIDRs: [10.244.0.0/16, "fd00:10:244::/48"], wireguardCIDR: 100.64.0.0/16, wireguardPort: 51820, serviceCIDR: 10.96.0.0/12, additionalCIDRs: [192.168.10.0/24]}
- {name: cluster-b, kubeconfigSecretRef: {name: cluster-b-kubeconfig, key: kubeconfig}, podCIDRs: [10.245.0.0/16, "fd00:10:245::/48"], wireguardCIDR: 100.65.0.0/16, wireguardPort: 52000, serviceCIDR: 172.16.0.0/12, additionalCIDRs: [192.168.20.0/24]}`},
		{name: "an overlap: both CRDs accept it, meshlet rejects it", operator: true, meshlet: "spec.clusters[1].podCIDRs", clusters: `
- ` + a + `
- {name: b, ` + ref + `, podCIDRs: [10.1.128.0/17], wireguardCIDR: 100.66.1.0/24}`},
		{name: "both forms in one entry: the operator's CRD drops allowedNetworks and persistentKeepalive", operator: true, pruned: true, clusters: `
- {name: a, local: true, allowedNetworks: [192.168.0.0/24], podCIDRs: [10.1.0.0/16], wireguardCIDR: 100.66.0.0/24}
- {name: b, ` + ref + `, podCIDRs: [10.2.0.0/16], wireguardCIDR: 100.66.1.0/24, persistentKeepalive: 25}`},
		// Where meshlet's CRD accepts more.
		{name: "0.6's form (why meshlet's CRD cannot require podCIDRs)", clusters: `
- {name: a, local: true, allowedNetworks: [10.1.0.0/16, 100.66.0.0/24]}
- {name: b, ` + ref + `, allowedNetworks: [10.2.0.0/16, 100.66.1.0/24], persistentKeepalive: 25}`},
		{name: "a name that is no DNS label", meshlet: "spec.clusters[1].name", clusters: `
- ` + a + `
- {name: Cluster_B, ` + ref + `, podCIDRs: [10.2.0.0/16], wireguardCIDR: 100.66.1.0/24}`},
		{name: "a port out of range", meshlet: "spec.clusters[1].wireguardPort", clusters: `
- ` + a + `
- {name: b, ` + ref + `, podCIDRs: [10.2.0.0/16], wireguardCIDR: 100.66.1.0/24, wireguardPort: 70000}`},
		{name: "port 0: 51820 to meshlet, the operator's default", clusters: `
- ` + a + `
- {name: b, ` + ref + `, podCIDRs: [10.2.0.0/16], wireguardCIDR: 100.66.1.0/24, wireguardPort: 0}`},
		{name: "a kubeconfigSecretRef without key: kubeconfig to meshlet", clusters: `
- ` + a + `
- {name: b, kubeconfigSecretRef: {name: b-kubeconfig}, podCIDRs: [10.2.0.0/16], wireguardCIDR: 100.66.1.0/24}`},
		{name: "no wireguardCIDR, no podCIDRs: the networks written", clusters: `
- {name: a, local: true, podCIDRs: [10.1.0.0/16]}
- {name: b, ` + ref + `, podCIDRs: [], serviceCIDR: 10.96.0.0/12}`},
		{name: "a single cluster", clusters: `
- ` + a},
	}

	type outcome struct {
		err  error
		spec map[string]any
	}
	results := map[string][]outcome{}
	for _, crd := range []string{operatorCRD, "crds/clustermeshes.kilo.squat.ai.yaml"} {
		if _, err := apiserver.ApplyFile(ctx, admin, crd, apiserver.ApplyOptions{}); err != nil {
			t.Fatalf("%s: %v", crd, err)
		}
		for _, c := range cases {
			obj := decode(t, []byte(fmt.Sprintf("apiVersion: kilo.squat.ai/v1alpha1\nkind: ClusterMesh\nmetadata: {name: m, namespace: %s}\nspec:\n  clusters:%s\n",
				ns, strings.ReplaceAll(c.clusters, "\n", "\n  "))))[0]
			got, err := dyn.Resource(cmGVR).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			o := outcome{err: err}
			if err == nil {
				o.spec, _ = got.Object["spec"].(map[string]any)
			} else if !apierrors.IsInvalid(err) {
				t.Fatalf("%s, %s: %v", crd, c.name, err)
			}
			results[crd] = append(results[crd], o)
		}
		deleteCRD(ctx, t, dyn, "clustermeshes.kilo.squat.ai")
	}

	for i, c := range cases {
		op, ml := results[operatorCRD][i], results["crds/clustermeshes.kilo.squat.ai.yaml"][i]
		sent := decode(t, []byte("clusters:"+c.clusters))[0].Object
		switch {
		case ml.err != nil:
			t.Errorf("%s: meshlet's CRD refuses it: %v", c.name, ml.err)
			continue
		case !reflect.DeepEqual(normalize(t, ml.spec), normalize(t, sent)):
			t.Errorf("%s: meshlet's CRD stored %v, want what was sent, %v", c.name, ml.spec, sent)
		case (op.err == nil) != c.operator:
			t.Errorf("%s: the operator's CRD accepts it: %v (err %v), want %v", c.name, op.err == nil, op.err, c.operator)
		}
		mesh := func(spec map[string]any) (any, []string) {
			var m clustermesh.ClusterMesh
			if err := json.Unmarshal(mustJSON(t, map[string]any{"metadata": map[string]any{"name": "m", "namespace": ns}, "spec": spec}), &m); err != nil {
				t.Fatal(err)
			}
			tm, rejs := clustermesh.Validate(&m, "")
			var fields []string
			for _, r := range rejs {
				fields = append(fields, r.Field)
			}
			return tm, fields
		}
		mlMesh, mlRejected := mesh(ml.spec)
		if want := c.meshlet; (want == "" && mlRejected != nil) || (want != "" && !reflect.DeepEqual(mlRejected, []string{want})) {
			t.Errorf("%s: meshlet rejects %v, want %q", c.name, mlRejected, want)
		}
		if op.err == nil {
			// Stored by the operator's CRD (defaults applied): the same to
			// meshlet, but for what that CRD prunes.
			opMesh, opRejected := mesh(op.spec)
			same := reflect.DeepEqual(opMesh, mlMesh) && reflect.DeepEqual(opRejected, mlRejected)
			if same == c.pruned {
				t.Errorf("%s: meshlet reads the operator's stored object as %+v %v, meshlet's as %+v %v (pruned: %v)", c.name, opMesh, opRejected, mlMesh, mlRejected, c.pruned)
			}
			if b := string(mustJSON(t, op.spec)); c.pruned && (strings.Contains(b, "allowedNetworks") || strings.Contains(b, "persistentKeepalive")) {
				t.Errorf("%s: the operator's CRD kept 0.6's fields: %s", c.name, b)
			}
		}
		t.Logf("%s: operator's CRD %s; meshlet's CRD stores it as sent; meshlet rejects %v", c.name, verdict(op.err), mlRejected)
	}
}

func verdict(err error) string {
	if err == nil {
		return "accepts"
	}
	return "refuses (" + err.Error() + ")"
}

// deleteCRD deletes a CRD and waits until it is gone (its objects are
// removed first), so that one of the same name can be created.
func deleteCRD(ctx context.Context, t *testing.T, dyn dynamic.Interface, name string) {
	t.Helper()
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	if err := crds.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := crds.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRD %s not gone: %v", name, err)
		}
		time.Sleep(100 * time.Millisecond) // poll interval
	}
}

// TestPeerCRDIsKilos: the Peer CRD generated from meshlet's types has Kilo
// 0.7's structural schema — the same fields, types, formats and required
// fields (descriptions aside), so objects valid under Kilo's CRD are valid
// under meshlet's and stored the same. Kilo's is generated the same way from
// its types; the shape below is written from it (docs/kilo-api.md).
func TestPeerCRDIsKilos(t *testing.T) {
	b, err := os.ReadFile("crds/peers.kilo.squat.ai.yaml")
	if err != nil {
		t.Fatal(err)
	}
	crd := decode(t, b)[0]
	if g, s := crd.Object["spec"].(map[string]any)["group"], crd.Object["spec"].(map[string]any)["scope"]; g != "kilo.squat.ai" || s != "Cluster" {
		t.Errorf("group %v, scope %v: want kilo.squat.ai, Cluster", g, s)
	}
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	if len(versions) != 1 || versions[0].(map[string]any)["name"] != "v1alpha1" {
		t.Fatalf("versions %v: want v1alpha1 alone", versions)
	}
	got, _, _ := unstructured.NestedMap(versions[0].(map[string]any), "schema", "openAPIV3Schema")
	str := func() map[string]any { return map[string]any{"type": "string"} }
	want := map[string]any{
		"type": "object", "required": []any{"spec"},
		"properties": map[string]any{
			"apiVersion": str(), "kind": str(), "metadata": map[string]any{"type": "object"},
			"spec": map[string]any{
				"type": "object", "required": []any{"allowedIPs", "publicKey"},
				"properties": map[string]any{
					"allowedIPs": map[string]any{"type": "array", "items": str()},
					"endpoint": map[string]any{
						"type": "object", "required": []any{"dnsOrIP", "port"},
						"properties": map[string]any{
							"dnsOrIP": map[string]any{"type": "object", "properties": map[string]any{"dns": str(), "ip": str()}},
							"port":    map[string]any{"type": "integer", "format": "int32"},
						},
					},
					"persistentKeepalive": map[string]any{"type": "integer"},
					"presharedKey":        str(),
					"publicKey":           str(),
				},
			},
		},
	}
	if stripDescriptions(got); !reflect.DeepEqual(got, want) {
		t.Errorf("Peer schema differs from Kilo's:\n got %s\nwant %s", mustJSON(t, got), mustJSON(t, want))
	}
}

// stripDescriptions removes every description from a schema, in place.
func stripDescriptions(s map[string]any) {
	delete(s, "description")
	for _, v := range s {
		switch v := v.(type) {
		case map[string]any:
			stripDescriptions(v)
		case []any:
			for _, e := range v {
				if m, ok := e.(map[string]any); ok {
					stripDescriptions(m)
				}
			}
		}
	}
}
