package clustermesh

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/yaml"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// docMesh is docs/clustermesh.md's example.
const docMesh = `
apiVersion: kilo.squat.ai/v1alpha1
kind: ClusterMesh
metadata: {name: prod, namespace: kilo-system}
spec:
  clusters:
    - name: cluster-a
      local: true
      allowedNetworks: [10.1.0.0/16, 100.66.0.0/24, 10.96.0.0/12]
      wireguardPort: 51820
      persistentKeepalive: 0
    - name: cluster-b
      kubeconfigSecretRef: {name: cluster-b-kubeconfig, key: kubeconfig}
      allowedNetworks: [10.2.0.0/16, 100.66.1.0/24, 10.112.0.0/12]
      persistentKeepalive: 25
status:
  clusters: [{name: cluster-b, registeredPeers: 3, skippedNodes: 0}]
  conditions: [{type: Ready, status: "True", reason: Synced, message: ok, lastTransitionTime: "2026-01-01T00:00:00Z"}]
`

func decodeMesh(t testing.TB, y string) *ClusterMesh {
	t.Helper()
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	obj, _, err := serializer.NewCodecFactory(s).UniversalDeserializer().Decode(j, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return obj.(*ClusterMesh)
}

func pfx(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestDocExample(t *testing.T) {
	m := decodeMesh(t, docMesh)
	if m.Status.Clusters[0].RegisteredPeers != 3 || m.Status.Conditions[0].Type != ConditionReady {
		t.Fatalf("status %+v", m.Status)
	}
	want := topology.Mesh{Namespace: "kilo-system", Name: "prod", Clusters: []topology.MeshCluster{
		{Name: "cluster-a", Local: true, AllowedNetworks: pfx("10.1.0.0/16", "100.66.0.0/24", "10.96.0.0/12"), WireGuardPort: 51820},
		{Name: "cluster-b", AllowedNetworks: pfx("10.2.0.0/16", "100.66.1.0/24", "10.112.0.0/12"), WireGuardPort: 51820, PersistentKeepalive: 25},
	}}
	res := Resolve([]*ClusterMesh{m}, "")
	if len(res.Rejections) > 0 || !reflect.DeepEqual(res.Meshes, []topology.Mesh{want}) {
		t.Fatalf("got %+v %v", res.Meshes, res.Rejections)
	}
	wantKC := []Kubeconfig{{Mesh: topology.ObjectRef{Kind: "ClusterMesh", Namespace: "kilo-system", Name: "prod"}, Cluster: "cluster-b",
		Namespace: "kilo-system", Name: "cluster-b-kubeconfig", Key: "kubeconfig", Field: "spec.clusters[1].kubeconfigSecretRef"}}
	if !reflect.DeepEqual(res.Kubeconfigs, wantKC) {
		t.Fatalf("kubeconfigs %+v", res.Kubeconfigs)
	}
	// The same manifest on cluster-b: its entry is found by name.
	m.Spec.Clusters[0].KubeconfigSecretRef = &SecretKeyRef{Name: "cluster-a-kubeconfig"}
	meshes, rejs := ToTopology([]*ClusterMesh{m}, "cluster-b")
	if len(rejs) > 0 || meshes[0].Clusters[0].Local || !meshes[0].Clusters[1].Local {
		t.Fatalf("cluster-b view: %+v %v", meshes, rejs)
	}
	// Round trip through JSON keeps the schema's field names.
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{`"allowedNetworks"`, `"wireguardPort"`, `"persistentKeepalive"`, `"kubeconfigSecretRef"`, `"registeredPeers"`, `"skippedNodes"`} {
		if !strings.Contains(string(b), f) {
			t.Errorf("JSON lacks %s: %s", f, b)
		}
	}
}

func TestDeepCopy(t *testing.T) {
	m := decodeMesh(t, docMesh)
	c := m.DeepCopyObject().(*ClusterMesh)
	c.Spec.Clusters[0].AllowedNetworks[0] = "x"
	c.Spec.Clusters[1].KubeconfigSecretRef.Name = "y"
	c.Status.Clusters[0].Name = "z"
	c.Status.Conditions[0].Type = "w"
	if !reflect.DeepEqual(m, decodeMesh(t, docMesh)) {
		t.Fatal("DeepCopy shares memory")
	}
	l := (&ClusterMeshList{Items: []ClusterMesh{*m}}).DeepCopyObject().(*ClusterMeshList)
	l.Items[0].Spec.Clusters[0].Name = "q"
	if m.Spec.Clusters[0].Name != "cluster-a" {
		t.Fatal("list DeepCopy shares memory")
	}
}

// mesh builds a ClusterMesh; clusters are "name[*]=cidr,cidr" (* = local).
func mesh(ns, name string, clusters ...string) *ClusterMesh {
	m := &ClusterMesh{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	for i, c := range clusters {
		n, nets, _ := strings.Cut(c, "=")
		e := Cluster{Name: strings.TrimSuffix(n, "*"), Local: strings.HasSuffix(n, "*")}
		if nets != "" {
			e.AllowedNetworks = strings.Split(nets, ",")
		}
		if !e.Local {
			e.KubeconfigSecretRef = &SecretKeyRef{Name: "kubeconfig-" + strconv.Itoa(i), Key: "kubeconfig"}
		}
		m.Spec.Clusters = append(m.Spec.Clusters, e)
	}
	return m
}

type rej struct {
	mesh, field string
	reason      topology.Reason
}

func rejections(rs []topology.Rejection) []rej {
	var out []rej
	for _, r := range rs {
		out = append(out, rej{r.Object.Namespace + "/" + r.Object.Name, r.Field, r.Reason})
	}
	return out
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name        string
		mesh        *ClusterMesh
		clusterName string
		edit        func(*ClusterMesh)
		want        []rej // nil = valid
		check       func(t *testing.T, m topology.Mesh)
	}{
		{name: "valid", mesh: mesh("ns", "m", "a*=10.1.0.0/16", "b=10.2.0.0/16")},
		{
			name: "defaults: port 51820, keepalive 0, key kubeconfig, CIDRs masked",
			mesh: mesh("ns", "m", "a*=10.1.0.0/16", "b=10.2.3.4/16"),
			check: func(t *testing.T, m topology.Mesh) {
				b := m.Clusters[1]
				if b.WireGuardPort != 51820 || b.PersistentKeepalive != 0 || !reflect.DeepEqual(b.AllowedNetworks, pfx("10.2.0.0/16")) {
					t.Fatalf("%+v", b)
				}
			},
		},
		{name: "overlap within a cluster", mesh: mesh("ns", "m", "a*=10.1.0.0/16,10.1.128.0/17", "b=10.2.0.0/16"),
			want: []rej{{"ns/m", "spec.clusters[0].allowedNetworks", topology.ReasonNetworksOverlap}}},
		{name: "duplicate network within a cluster", mesh: mesh("ns", "m", "a*=10.1.0.0/16", "b=10.2.0.0/16,10.2.0.0/16"),
			want: []rej{{"ns/m", "spec.clusters[1].allowedNetworks", topology.ReasonNetworksOverlap}}},
		{name: "overlap across clusters", mesh: mesh("ns", "m", "a*=10.1.0.0/16,100.66.0.0/24", "b=10.2.0.0/16,100.66.0.0/16"),
			want: []rej{{"ns/m", "spec.clusters[1].allowedNetworks", topology.ReasonNetworksOverlap}}},
		{name: "missing local entry", mesh: mesh("ns", "m", "a=10.1.0.0/16", "b=10.2.0.0/16"),
			want: []rej{{"ns/m", "spec.clusters", topology.ReasonInvalidClusterMesh}}},
		{name: "missing local entry, unknown cluster name", mesh: mesh("ns", "m", "a=10.1.0.0/16", "b=10.2.0.0/16"), clusterName: "c",
			want: []rej{{"ns/m", "spec.clusters", topology.ReasonInvalidClusterMesh}}},
		{name: "cluster name resolves local without local: true", mesh: mesh("ns", "m", "a=10.1.0.0/16", "b=10.2.0.0/16"), clusterName: "b",
			check: func(t *testing.T, m topology.Mesh) {
				if m.Clusters[0].Local || !m.Clusters[1].Local {
					t.Fatalf("%+v", m)
				}
			}},
		{name: "unknown cluster name falls back to local: true", mesh: mesh("ns", "m", "a*=10.1.0.0/16", "b=10.2.0.0/16"), clusterName: "zzz",
			check: func(t *testing.T, m topology.Mesh) {
				if !m.Clusters[0].Local {
					t.Fatalf("%+v", m)
				}
			}},
		{name: "two local entries", mesh: mesh("ns", "m", "a*=10.1.0.0/16", "b*=10.2.0.0/16"),
			want: []rej{{"ns/m", "spec.clusters", topology.ReasonInvalidClusterMesh}}},
		{name: "empty", mesh: mesh("ns", "m"), want: []rej{{"ns/m", "spec.clusters", topology.ReasonInvalidClusterMesh}}},
		{name: "bad names", mesh: mesh("ns", "m", "a*=10.1.0.0/16", "Cluster_B=10.2.0.0/16", strings.Repeat("c", 64)+"=10.3.0.0/16", "=10.4.0.0/16"),
			want: []rej{
				{"ns/m", "spec.clusters[1].name", topology.ReasonInvalidClusterMesh},
				{"ns/m", "spec.clusters[2].name", topology.ReasonInvalidClusterMesh},
				{"ns/m", "spec.clusters[3].name", topology.ReasonInvalidClusterMesh},
			}},
		{name: "63-character name is fine", mesh: mesh("ns", "m", "a*=10.1.0.0/16", strings.Repeat("c", 63)+"=10.2.0.0/16")},
		{name: "duplicate names", mesh: mesh("ns", "m", "a*=10.1.0.0/16", "b=10.2.0.0/16", "b=10.3.0.0/16"),
			want: []rej{{"ns/m", "spec.clusters[2].name", topology.ReasonInvalidClusterMesh}}},
		{name: "bad CIDR", mesh: mesh("ns", "m", "a*=10.1.0.0/16", "b=10.2.0.0/16,10.3.0.1,x"),
			want: []rej{{"ns/m", "spec.clusters[1].allowedNetworks[1]", topology.ReasonInvalidCIDR}, {"ns/m", "spec.clusters[1].allowedNetworks[2]", topology.ReasonInvalidCIDR}}},
		{name: "default route", mesh: mesh("ns", "m", "a*=10.1.0.0/16", "b=0.0.0.0/0"),
			want: []rej{{"ns/m", "spec.clusters[1].allowedNetworks[0]", topology.ReasonDefaultRoute}}},
		{name: "ports", mesh: mesh("ns", "m", "a*=10.1.0.0/16", "b=10.2.0.0/16", "c=10.3.0.0/16"),
			edit: func(m *ClusterMesh) { m.Spec.Clusters[1].WireguardPort = 65536; m.Spec.Clusters[2].WireguardPort = -1 },
			want: []rej{{"ns/m", "spec.clusters[1].wireguardPort", topology.ReasonInvalidClusterMesh}, {"ns/m", "spec.clusters[2].wireguardPort", topology.ReasonInvalidClusterMesh}}},
		{name: "port and keepalive kept", mesh: mesh("ns", "m", "a*=10.1.0.0/16", "b=10.2.0.0/16"),
			edit: func(m *ClusterMesh) {
				m.Spec.Clusters[1].WireguardPort = 1
				m.Spec.Clusters[1].PersistentKeepalive = 65535
			},
			check: func(t *testing.T, m topology.Mesh) {
				if m.Clusters[1].WireGuardPort != 1 || m.Clusters[1].PersistentKeepalive != 65535 {
					t.Fatalf("%+v", m.Clusters[1])
				}
			}},
		{name: "keepalive range", mesh: mesh("ns", "m", "a*=10.1.0.0/16", "b=10.2.0.0/16"),
			edit: func(m *ClusterMesh) {
				m.Spec.Clusters[0].PersistentKeepalive = -1
				m.Spec.Clusters[1].PersistentKeepalive = 65536
			},
			want: []rej{{"ns/m", "spec.clusters[0].persistentKeepalive", topology.ReasonInvalidClusterMesh}, {"ns/m", "spec.clusters[1].persistentKeepalive", topology.ReasonInvalidClusterMesh}}},
		{name: "remote without kubeconfigSecretRef", mesh: mesh("ns", "m", "a*=10.1.0.0/16", "b=10.2.0.0/16", "c=10.3.0.0/16"),
			edit: func(m *ClusterMesh) {
				m.Spec.Clusters[1].KubeconfigSecretRef = nil
				m.Spec.Clusters[2].KubeconfigSecretRef = &SecretKeyRef{Key: "k"}
			},
			want: []rej{{"ns/m", "spec.clusters[1].kubeconfigSecretRef", topology.ReasonInvalidClusterMesh}, {"ns/m", "spec.clusters[2].kubeconfigSecretRef", topology.ReasonInvalidClusterMesh}}},
		{name: "local entry needs no kubeconfigSecretRef", mesh: mesh("ns", "m", "a*=10.1.0.0/16", "b=10.2.0.0/16"),
			edit: func(m *ClusterMesh) { m.Spec.Clusters[0].KubeconfigSecretRef = nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.edit != nil {
				tt.edit(tt.mesh)
			}
			got, rejs := Validate(tt.mesh, tt.clusterName)
			if r := rejections(rejs); !reflect.DeepEqual(r, tt.want) {
				t.Fatalf("rejections %+v (%v), want %+v", r, rejs, tt.want)
			}
			if tt.want != nil {
				if !reflect.DeepEqual(got, topology.Mesh{}) {
					t.Fatalf("invalid mesh leaked: %+v", got)
				}
				return
			}
			locals := 0
			for _, c := range got.Clusters {
				if c.Local {
					locals++
				}
			}
			if locals != 1 || got.Name != tt.mesh.Name || got.Namespace != tt.mesh.Namespace {
				t.Fatalf("mesh %+v", got)
			}
			if tt.check != nil {
				tt.check(t, got)
			}
		})
	}
	if m, r := Validate(nil, ""); r != nil || !reflect.DeepEqual(m, topology.Mesh{}) {
		t.Fatal("nil mesh")
	}
}

func TestResolveAcrossMeshes(t *testing.T) {
	tests := []struct {
		name        string
		meshes      []*ClusterMesh
		clusterName string
		accepted    []string
		want        []rej
	}{
		{
			name:     "two meshes sharing the local cluster and no networks",
			meshes:   []*ClusterMesh{mesh("ns", "m2", "a*=10.1.0.0/16", "c=10.3.0.0/16"), mesh("ns", "m1", "a*=10.1.0.0/16", "b=10.2.0.0/16")},
			accepted: []string{"ns/m1", "ns/m2"},
		},
		{
			name:     "same remote cluster in two meshes with the same networks",
			meshes:   []*ClusterMesh{mesh("ns", "m1", "a*=10.1.0.0/16", "b=10.2.0.0/16"), mesh("ns", "m2", "a*=10.1.0.0/16", "b=10.2.0.0/16")},
			accepted: []string{"ns/m1", "ns/m2"},
		},
		{
			name:     "same cluster with different networks: later mesh rejected",
			meshes:   []*ClusterMesh{mesh("ns", "m2", "a*=10.1.0.0/16", "b=10.2.0.0/16,10.9.0.0/16"), mesh("ns", "m1", "a*=10.1.0.0/16", "b=10.2.0.0/16")},
			accepted: []string{"ns/m1"},
			want:     []rej{{"ns/m2", "spec.clusters[1].allowedNetworks", ReasonMeshConflict}},
		},
		{
			name:     "local cluster with different networks in another mesh",
			meshes:   []*ClusterMesh{mesh("a", "x", "a*=10.1.0.0/16", "b=10.2.0.0/16"), mesh("b", "x", "a*=10.1.0.0/17", "c=10.3.0.0/16")},
			accepted: []string{"a/x"},
			want:     []rej{{"b/x", "spec.clusters[0].allowedNetworks", ReasonMeshConflict}},
		},
		{
			name:     "different clusters overlapping across meshes: later rejected, namespace first",
			meshes:   []*ClusterMesh{mesh("z", "a", "a*=10.1.0.0/16", "c=10.2.128.0/17"), mesh("a", "z", "a*=10.1.0.0/16", "b=10.2.0.0/16")},
			accepted: []string{"a/z"},
			want:     []rej{{"z/a", "spec.clusters[1].allowedNetworks", topology.ReasonNetworksOverlap}},
		},
		{
			name:     "remote overlapping the local cluster of another mesh",
			meshes:   []*ClusterMesh{mesh("ns", "m1", "a*=10.1.0.0/16", "b=10.2.0.0/16"), mesh("ns", "m2", "a*=10.1.0.0/16", "c=10.1.5.0/24")},
			accepted: []string{"ns/m1"},
			want:     []rej{{"ns/m2", "spec.clusters[1].allowedNetworks", topology.ReasonNetworksOverlap}},
		},
		{
			name: "an invalid earlier mesh does not block a later one",
			meshes: []*ClusterMesh{mesh("ns", "m1", "a*=10.1.0.0/16", "b=10.2.0.0/16,10.2.0.0/24"),
				mesh("ns", "m2", "a*=10.1.0.0/16", "b=10.2.0.0/16")},
			accepted: []string{"ns/m2"},
			want:     []rej{{"ns/m1", "spec.clusters[1].allowedNetworks", topology.ReasonNetworksOverlap}},
		},
		{
			name:     "nil and duplicate objects",
			meshes:   []*ClusterMesh{nil, mesh("ns", "m", "a*=10.1.0.0/16"), mesh("ns", "m", "a*=10.1.0.0/16")},
			accepted: []string{"ns/m"},
			want:     []rej{{"ns/m", "", topology.ReasonInvalidClusterMesh}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := Resolve(tt.meshes, tt.clusterName)
			var accepted []string
			for _, m := range res.Meshes {
				accepted = append(accepted, m.Namespace+"/"+m.Name)
			}
			if !reflect.DeepEqual(accepted, tt.accepted) {
				t.Fatalf("accepted %v, want %v (%v)", accepted, tt.accepted, res.Rejections)
			}
			if r := rejections(res.Rejections); !reflect.DeepEqual(r, tt.want) {
				t.Fatalf("rejections %+v, want %+v", r, tt.want)
			}
			// Order of the input does not matter.
			rev := make([]*ClusterMesh, len(tt.meshes))
			for i, m := range tt.meshes {
				rev[len(rev)-1-i] = m
			}
			if res2 := Resolve(rev, tt.clusterName); !reflect.DeepEqual(res2.Meshes, res.Meshes) || len(res2.Rejections) != len(res.Rejections) {
				t.Fatal("result depends on input order")
			}
		})
	}
}

// operatorMesh is the later kilo-clustermesh-operator's form: the "Full"
// example of that project's own documentation (docs/configuration.md in
// github.com/cozystack/kilo-clustermesh-operator, not a file of this
// repository), with cluster-b's kubeconfig.
const operatorMesh = `
apiVersion: kilo.squat.ai/v1alpha1
kind: ClusterMesh
metadata: {name: prod-mesh, namespace: kilo-system}
spec:
  clusters:
    - name: cluster-a
      local: true
      podCIDRs: [10.244.0.0/16, "fd00:10:244::/48"]
      wireguardCIDR: 100.64.0.0/16
      wireguardPort: 51820
      serviceCIDR: 10.96.0.0/12
      additionalCIDRs: [192.168.10.0/24]
    - name: cluster-b
      kubeconfigSecretRef: {name: cluster-b-kubeconfig, key: kubeconfig}
      podCIDRs: [10.245.0.0/16, "fd00:10:245::/48"]
      wireguardCIDR: 100.65.0.0/16
      wireguardPort: 52000
      serviceCIDR: 172.16.0.0/12
      additionalCIDRs: [192.168.20.0/24]
`

// TestOperatorSchema: an entry in the later operator's form means
// allowedNetworks = podCIDRs ∪ {wireguardCIDR} ∪ {serviceCIDR} ∪
// additionalCIDRs, in that order, with keepalive 0 (the nodes' annotations
// decide); the JSON keeps the operator's field names.
func TestOperatorSchema(t *testing.T) {
	m := decodeMesh(t, operatorMesh)
	want := topology.Mesh{Namespace: "kilo-system", Name: "prod-mesh", Clusters: []topology.MeshCluster{
		{Name: "cluster-a", Local: true, AllowedNetworks: pfx("10.244.0.0/16", "fd00:10:244::/48", "100.64.0.0/16", "10.96.0.0/12", "192.168.10.0/24"), WireGuardPort: 51820},
		{Name: "cluster-b", AllowedNetworks: pfx("10.245.0.0/16", "fd00:10:245::/48", "100.65.0.0/16", "172.16.0.0/12", "192.168.20.0/24"), WireGuardPort: 52000},
	}}
	res := Resolve([]*ClusterMesh{m}, "")
	if len(res.Rejections) > 0 || !reflect.DeepEqual(res.Meshes, []topology.Mesh{want}) {
		t.Fatalf("got %+v %v", res.Meshes, res.Rejections)
	}
	if len(res.Kubeconfigs) != 1 || res.Kubeconfigs[0].Name != "cluster-b-kubeconfig" {
		t.Fatalf("kubeconfigs %+v", res.Kubeconfigs)
	}
	b, err := json.Marshal(m.Spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{`"podCIDRs"`, `"wireguardCIDR"`, `"serviceCIDR"`, `"additionalCIDRs"`} {
		if !strings.Contains(string(b), f) {
			t.Errorf("JSON lacks %s: %s", f, b)
		}
	}
	if strings.Contains(string(b), "allowedNetworks") || strings.Contains(string(b), "persistentKeepalive") {
		t.Errorf("JSON has fields the entry did not set: %s", b)
	}
	c := m.DeepCopy()
	c.Spec.Clusters[0].PodCIDRs[0], c.Spec.Clusters[0].AdditionalCIDRs[0] = "x", "y"
	if !reflect.DeepEqual(m, decodeMesh(t, operatorMesh)) {
		t.Fatal("DeepCopy shares podCIDRs or additionalCIDRs")
	}
}

// TestBothSchemas: the networks of an entry are those of both forms added
// up; one network written in both counts once (an entry being moved from
// one form to the other), and each problem is named by the field the user
// wrote.
func TestBothSchemas(t *testing.T) {
	remote := &SecretKeyRef{Name: "b-kubeconfig"}
	tests := []struct {
		name     string
		clusters []Cluster
		want     []rej      // nil = valid
		networks [][]string // valid: each cluster's AllowedNetworks
		fields   [][]string // valid: the list each network came from
		check    func(*testing.T, topology.Mesh)
	}{
		{name: "the later form alone, without serviceCIDR or additionalCIDRs",
			clusters: []Cluster{{Name: "a", Local: true, PodCIDRs: []string{"10.1.0.0/16"}, WireguardCIDR: "100.66.0.0/24"},
				{Name: "b", KubeconfigSecretRef: remote, PodCIDRs: []string{"10.2.0.0/16"}, WireguardCIDR: "100.66.1.0/24", WireguardPort: 51821}},
			networks: [][]string{{"10.1.0.0/16", "100.66.0.0/24"}, {"10.2.0.0/16", "100.66.1.0/24"}},
			fields: [][]string{{"spec.clusters[0].podCIDRs", "spec.clusters[0].wireguardCIDR"},
				{"spec.clusters[1].podCIDRs", "spec.clusters[1].wireguardCIDR"}},
			check: func(t *testing.T, m topology.Mesh) {
				if b := m.Clusters[1]; b.PersistentKeepalive != 0 || b.WireGuardPort != 51821 {
					t.Errorf("cluster b: %+v, want keepalive 0 (the nodes' annotations decide), port 51821", b)
				}
			}},
		{name: "one entry in each form",
			clusters: []Cluster{{Name: "a", Local: true, AllowedNetworks: []string{"10.1.0.0/16", "100.66.0.0/24"}},
				{Name: "b", KubeconfigSecretRef: remote, PodCIDRs: []string{"10.2.0.0/16"}, WireguardCIDR: "100.66.1.0/24", PersistentKeepalive: 25}},
			networks: [][]string{{"10.1.0.0/16", "100.66.0.0/24"}, {"10.2.0.0/16", "100.66.1.0/24"}},
			check: func(t *testing.T, m topology.Mesh) {
				if m.Clusters[1].PersistentKeepalive != 25 {
					t.Errorf("persistentKeepalive beside the later form: %+v", m.Clusters[1])
				}
			}},
		{name: "both forms in one entry add up, allowedNetworks first",
			clusters: []Cluster{{Name: "a", Local: true, AllowedNetworks: []string{"192.168.0.0/24"}, PodCIDRs: []string{"10.1.0.0/16"},
				WireguardCIDR: "100.66.0.0/24", ServiceCIDR: "10.96.0.0/12", AdditionalCIDRs: []string{"192.168.1.0/24", "fd00:1::/64"}},
				{Name: "b", KubeconfigSecretRef: remote, AllowedNetworks: []string{"10.2.0.0/16"}, AdditionalCIDRs: []string{"192.168.2.0/24"}}},
			networks: [][]string{{"192.168.0.0/24", "10.1.0.0/16", "100.66.0.0/24", "10.96.0.0/12", "192.168.1.0/24", "fd00:1::/64"},
				{"10.2.0.0/16", "192.168.2.0/24"}},
			fields: [][]string{{"spec.clusters[0].allowedNetworks", "spec.clusters[0].podCIDRs", "spec.clusters[0].wireguardCIDR",
				"spec.clusters[0].serviceCIDR", "spec.clusters[0].additionalCIDRs", "spec.clusters[0].additionalCIDRs"},
				{"spec.clusters[1].allowedNetworks", "spec.clusters[1].additionalCIDRs"}}},
		{name: "a network in both forms counts once (masked before comparing)",
			clusters: []Cluster{{Name: "a", Local: true, AllowedNetworks: []string{"10.1.0.0/16", "100.66.0.0/24", "10.96.0.0/12"},
				PodCIDRs: []string{"10.1.2.3/16"}, WireguardCIDR: "100.66.0.0/24", ServiceCIDR: " 10.96.0.0/12"},
				{Name: "b", KubeconfigSecretRef: remote, AllowedNetworks: []string{"10.2.0.0/16"}}},
			networks: [][]string{{"10.1.0.0/16", "100.66.0.0/24", "10.96.0.0/12"}, {"10.2.0.0/16"}}},
		{name: "a repeat within the later form is an overlap, as for the operator",
			clusters: []Cluster{{Name: "a", Local: true, PodCIDRs: []string{"10.1.0.0/16"}, WireguardCIDR: "100.66.0.0/24", AdditionalCIDRs: []string{"10.1.0.0/16"}},
				{Name: "b", KubeconfigSecretRef: remote, PodCIDRs: []string{"10.2.0.0/16"}}},
			want: []rej{{"ns/m", "spec.clusters[0].additionalCIDRs", topology.ReasonNetworksOverlap}}},
		{name: "a narrower network in the other form is an overlap",
			clusters: []Cluster{{Name: "a", Local: true, AllowedNetworks: []string{"10.0.0.0/8"}, PodCIDRs: []string{"10.1.0.0/16"}},
				{Name: "b", KubeconfigSecretRef: remote, PodCIDRs: []string{"172.16.0.0/16"}}},
			want: []rej{{"ns/m", "spec.clusters[0].podCIDRs", topology.ReasonNetworksOverlap}}},
		{name: "overlap across clusters named by the later network's field",
			clusters: []Cluster{{Name: "a", Local: true, PodCIDRs: []string{"10.1.0.0/16"}, WireguardCIDR: "100.66.0.0/16"},
				{Name: "b", KubeconfigSecretRef: remote, PodCIDRs: []string{"10.2.0.0/16"}, WireguardCIDR: "100.66.1.0/24"}},
			want: []rej{{"ns/m", "spec.clusters[1].wireguardCIDR", topology.ReasonNetworksOverlap}}},
		{name: "bad CIDRs are named as written",
			clusters: []Cluster{{Name: "a", Local: true, PodCIDRs: []string{"10.1.0.0/16"}, WireguardCIDR: "100.66.0.0/24"},
				{Name: "b", KubeconfigSecretRef: remote, PodCIDRs: []string{"10.2.0.0/16", "10.3.0.0"}, WireguardCIDR: "x",
					ServiceCIDR: "::ffff:10.4.0.0/112", AdditionalCIDRs: []string{"10.5.0.0/16", ""}}},
			want: []rej{{"ns/m", "spec.clusters[1].podCIDRs[1]", topology.ReasonInvalidCIDR}, {"ns/m", "spec.clusters[1].wireguardCIDR", topology.ReasonInvalidCIDR},
				{"ns/m", "spec.clusters[1].serviceCIDR", topology.ReasonInvalidCIDR}, {"ns/m", "spec.clusters[1].additionalCIDRs[1]", topology.ReasonInvalidCIDR}}},
		{name: "a default route in any field",
			clusters: []Cluster{{Name: "a", Local: true, PodCIDRs: []string{"10.1.0.0/16"}, AdditionalCIDRs: []string{"0.0.0.0/0"}},
				{Name: "b", KubeconfigSecretRef: remote, PodCIDRs: []string{"10.2.0.0/16"}, ServiceCIDR: "::/0"}},
			want: []rej{{"ns/m", "spec.clusters[0].additionalCIDRs[0]", topology.ReasonDefaultRoute}, {"ns/m", "spec.clusters[1].serviceCIDR", topology.ReasonDefaultRoute}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &ClusterMesh{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m"}, Spec: ClusterMeshSpec{Clusters: tt.clusters}}
			got, fields, rejs := validate(m, "")
			if r := rejections(rejs); !reflect.DeepEqual(r, tt.want) {
				t.Fatalf("rejections %+v (%v), want %+v", r, rejs, tt.want)
			}
			if tt.want != nil {
				if !reflect.DeepEqual(got, topology.Mesh{}) {
					t.Fatalf("invalid mesh leaked: %+v", got)
				}
				return
			}
			for i, c := range got.Clusters {
				if !reflect.DeepEqual(c.AllowedNetworks, pfx(tt.networks[i]...)) {
					t.Errorf("cluster %s: networks %v, want %v", c.Name, c.AllowedNetworks, tt.networks[i])
				}
			}
			if tt.fields != nil && !reflect.DeepEqual(fields, tt.fields) {
				t.Errorf("fields %v, want %v", fields, tt.fields)
			}
			if tt.check != nil {
				tt.check(t, got)
			}
		})
	}
}

// TestBothSchemasAcrossMeshes: one cluster declared in each form by two
// meshes is the same cluster when the networks are the same; otherwise the
// later mesh is rejected, named by the field the user wrote.
func TestBothSchemasAcrossMeshes(t *testing.T) {
	flat := mesh("ns", "m1", "a*=10.1.0.0/16,100.66.0.0/24", "b=10.2.0.0/16,100.66.1.0/24")
	later := func(name, bPod string) *ClusterMesh {
		return &ClusterMesh{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: ClusterMeshSpec{Clusters: []Cluster{
			{Name: "a", Local: true, PodCIDRs: []string{"10.1.0.0/16"}, WireguardCIDR: "100.66.0.0/24"},
			{Name: "b", KubeconfigSecretRef: &SecretKeyRef{Name: "b", Key: "kubeconfig"}, PodCIDRs: []string{bPod}, WireguardCIDR: "100.66.1.0/24"},
		}}}
	}
	res := Resolve([]*ClusterMesh{flat, later("m2", "10.2.0.0/16")}, "")
	if len(res.Meshes) != 2 || len(res.Rejections) != 0 {
		t.Fatalf("the same networks in the two forms: %+v %v", res.Meshes, res.Rejections)
	}
	res = Resolve([]*ClusterMesh{flat, later("m2", "10.2.0.0/17")}, "")
	if r := rejections(res.Rejections); !reflect.DeepEqual(r, []rej{{"ns/m2", "spec.clusters[1]", ReasonMeshConflict}}) || len(res.Meshes) != 1 {
		t.Fatalf("other networks: %+v", res.Rejections)
	}
	other := &ClusterMesh{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m3"}, Spec: ClusterMeshSpec{Clusters: []Cluster{
		{Name: "a", Local: true, AllowedNetworks: []string{"10.1.0.0/16", "100.66.0.0/24"}},
		{Name: "c", KubeconfigSecretRef: &SecretKeyRef{Name: "c"}, PodCIDRs: []string{"10.3.0.0/16"}, ServiceCIDR: "10.2.128.0/17"},
	}}}
	res = Resolve([]*ClusterMesh{flat, other}, "")
	if r := rejections(res.Rejections); !reflect.DeepEqual(r, []rej{{"ns/m3", "spec.clusters[1].serviceCIDR", topology.ReasonNetworksOverlap}}) {
		t.Fatalf("overlap across meshes: %+v", res.Rejections)
	}
}
