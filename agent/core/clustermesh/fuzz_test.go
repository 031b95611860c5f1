package clustermesh

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// FuzzClusterMeshJSON validates ClusterMeshes decoded from fuzzed JSON: no
// panics, a rejected mesh never comes out, an accepted one satisfies every
// rule, and the input order never changes the outcome. The seed corpus runs
// in plain `go test`.
func FuzzClusterMeshJSON(f *testing.F) {
	seeds := []struct{ a, b, name string }{
		{`{"metadata":{"name":"prod","namespace":"kilo-system"},"spec":{"clusters":[{"name":"cluster-a","local":true,"allowedNetworks":["10.1.0.0/16","100.66.0.0/24"]},{"name":"cluster-b","kubeconfigSecretRef":{"name":"b","key":"kubeconfig"},"allowedNetworks":["10.2.0.0/16"],"persistentKeepalive":25,"wireguardPort":51821}]}}`,
			`{"metadata":{"name":"other","namespace":"kilo-system"},"spec":{"clusters":[{"name":"cluster-a","local":true,"allowedNetworks":["10.1.0.0/16","100.66.0.0/24"]},{"name":"cluster-c","kubeconfigSecretRef":{"name":"c"},"allowedNetworks":["10.2.128.0/17"]}]}}`, ""},
		{`{"spec":{"clusters":[{"name":"a","allowedNetworks":["0.0.0.0/0","x","::/0"]},{"name":"a","local":true,"wireguardPort":-1,"persistentKeepalive":70000}]}}`, `{}`, "a"},
		{`{"spec":{"clusters":[]}}`, `{"spec":{"clusters":[{"name":"b","local":true},{"name":"b","local":true}]}}`, "b"},
		{`{"metadata":{"name":"x"},"spec":{"clusters":[{"name":"a","local":true,"allowedNetworks":["10.0.0.0/8","10.1.0.0/16"]}]}}`, `null`, ""},
		// The later operator's form (podCIDRs, wireguardCIDR, serviceCIDR,
		// additionalCIDRs), alone, beside 0.6's in another mesh, and both
		// in one entry.
		{`{"metadata":{"name":"prod","namespace":"kilo-system"},"spec":{"clusters":[{"name":"cluster-a","local":true,"podCIDRs":["10.244.0.0/16","fd00:10:244::/48"],"wireguardCIDR":"100.64.0.0/16","serviceCIDR":"10.96.0.0/12","additionalCIDRs":["192.168.10.0/24"]},{"name":"cluster-b","kubeconfigSecretRef":{"name":"b","key":"kubeconfig"},"podCIDRs":["10.245.0.0/16"],"wireguardCIDR":"100.65.0.0/16","wireguardPort":52000}]}}`,
			`{"metadata":{"name":"old","namespace":"kilo-system"},"spec":{"clusters":[{"name":"cluster-a","local":true,"allowedNetworks":["10.244.0.0/16","fd00:10:244::/48","100.64.0.0/16","10.96.0.0/12","192.168.10.0/24"]},{"name":"cluster-c","kubeconfigSecretRef":{"name":"c"},"allowedNetworks":["10.246.0.0/16"],"persistentKeepalive":25}]}}`, ""},
		{`{"spec":{"clusters":[{"name":"a","local":true,"allowedNetworks":["10.1.0.0/16"],"podCIDRs":["10.1.0.0/16","10.2.0.0/16"],"wireguardCIDR":"10.1.0.0/24","serviceCIDR":"0.0.0.0/0","additionalCIDRs":["x",""]},{"name":"b","kubeconfigSecretRef":{"name":"b"},"podCIDRs":[],"wireguardCIDR":"::ffff:1.2.3.4/128","serviceCIDR":" fd00::/8 "}]}}`,
			`{"spec":{"clusters":[{"name":"b","podCIDRs":["10.3.0.0/16"],"wireguardCIDR":"100.66.0.0/24"},{"name":"a","local":true,"podCIDRs":"10.4.0.0/16"}]}}`, "b"},
	}
	for _, s := range seeds {
		f.Add([]byte(s.a), []byte(s.b), s.name)
	}
	f.Fuzz(func(t *testing.T, a, b []byte, clusterName string) {
		var meshes []*ClusterMesh
		for _, data := range [][]byte{a, b} {
			var m ClusterMesh
			if json.Unmarshal(data, &m) == nil {
				meshes = append(meshes, &m)
			}
		}
		res := Resolve(meshes, clusterName)
		for _, m := range res.Meshes {
			checkMesh(t, m)
		}
		for _, m := range meshes {
			tm, rejs := Validate(m, clusterName)
			if len(rejs) > 0 && !reflect.DeepEqual(tm, topology.Mesh{}) {
				t.Fatal("rejected mesh returned")
			}
			if len(rejs) == 0 {
				checkMesh(t, tm)
			}
		}
		if len(meshes) == 2 {
			res2 := Resolve([]*ClusterMesh{meshes[1], meshes[0]}, clusterName)
			if !reflect.DeepEqual(res2.Meshes, res.Meshes) {
				t.Fatal("result depends on input order")
			}
		}
	})
}

// checkMesh asserts the invariants of an accepted mesh.
func checkMesh(t *testing.T, m topology.Mesh) {
	t.Helper()
	locals := 0
	names := map[string]bool{}
	for _, c := range m.Clusters {
		if c.Local {
			locals++
		}
		if names[c.Name] || c.Name == "" || len(c.Name) > 63 {
			t.Fatalf("bad or duplicate name %q", c.Name)
		}
		names[c.Name] = true
		if c.WireGuardPort < 1 || c.WireGuardPort > 65535 || c.PersistentKeepalive < 0 || c.PersistentKeepalive > 65535 {
			t.Fatalf("out of range: %+v", c)
		}
		for _, p := range c.AllowedNetworks {
			if !p.IsValid() || p.Bits() == 0 || p != p.Masked() {
				t.Fatalf("bad network %v", p)
			}
		}
	}
	if locals != 1 {
		t.Fatalf("%d local entries", locals)
	}
	for i, c := range m.Clusters {
		for j, d := range m.Clusters {
			for x, p := range c.AllowedNetworks {
				for y, q := range d.AllowedNetworks {
					if (i != j || x != y) && p.Overlaps(q) {
						t.Fatalf("overlap %v %v accepted", p, q)
					}
				}
			}
		}
	}
}

// FuzzValidateFields fuzzes the fields of a two-cluster mesh directly, which
// explores names, CIDRs and numbers far faster than raw JSON. Each mesh is
// also validated with its networks written in the later operator's form
// (podCIDRs for the first cluster, serviceCIDR and additionalCIDRs for the
// second, in the order they add up): the outcome must be the same.
func FuzzValidateFields(f *testing.F) {
	f.Add("a", "10.1.0.0/16,100.66.0.0/24", true, "b", "10.2.0.0/16", 51820, 25, "b-kubeconfig", "")
	f.Add("a", "10.1.0.0/16", false, "a", "10.1.0.0/17", 0, -1, "", "a")
	f.Add("A_", "x,0.0.0.0/0", true, "", "::/0,fd00::/8", 70000, 65536, "UPPER", "zzz")
	// Seeds shaped like the later form's: dual-stack pod CIDRs and the
	// WireGuard subnet; a service CIDR and host networks; a repeat; an
	// empty value.
	f.Add("cluster-a", "10.244.0.0/16,fd00:10:244::/48,100.64.0.0/16", true, "cluster-b", "172.16.0.0/12,10.245.0.0/16,100.65.0.0/16", 52000, 0, "cluster-b-kubeconfig", "")
	f.Add("a", "10.1.0.0/16,10.1.0.0/16", true, "b", "10.2.0.0/16,,10.96.0.0/12", 1, 0, "b", "b")
	f.Fuzz(func(t *testing.T, n1, nets1 string, local1 bool, n2, nets2 string, port, keepalive int, secret, clusterName string) {
		split := func(s string) []string {
			if s == "" {
				return nil
			}
			return strings.Split(s, ",")
		}
		m := &ClusterMesh{Spec: ClusterMeshSpec{Clusters: []Cluster{
			{Name: n1, Local: local1, AllowedNetworks: split(nets1)},
			{Name: n2, AllowedNetworks: split(nets2), WireguardPort: port, PersistentKeepalive: keepalive,
				KubeconfigSecretRef: &SecretKeyRef{Name: secret}},
		}}}
		m.Name, m.Namespace = "m", "ns"
		tm, rejs := Validate(m, clusterName)
		later := m.DeepCopy()
		a, b := &later.Spec.Clusters[0], &later.Spec.Clusters[1]
		a.PodCIDRs, a.AllowedNetworks = a.AllowedNetworks, nil
		if len(b.AllowedNetworks) > 0 && b.AllowedNetworks[0] != "" {
			b.ServiceCIDR, b.AllowedNetworks = b.AllowedNetworks[0], b.AllowedNetworks[1:]
		}
		b.AdditionalCIDRs, b.AllowedNetworks = b.AllowedNetworks, nil
		tm2, rejs2 := Validate(later, clusterName)
		if !reflect.DeepEqual(tm2, tm) || len(rejs2) != len(rejs) {
			t.Fatalf("the later form differs: %+v %v, 0.6's form: %+v %v", tm2, rejs2, tm, rejs)
		}
		for i := range rejs {
			if rejs2[i].Reason != rejs[i].Reason {
				t.Fatalf("the later form is rejected for %s, 0.6's form for %s", rejs2[i].Reason, rejs[i].Reason)
			}
		}
		if len(rejs) > 0 {
			if !reflect.DeepEqual(tm, topology.Mesh{}) {
				t.Fatal("rejected mesh returned")
			}
			for _, r := range rejs {
				if r.Reason == "" || r.Message == "" || r.Object.Name != "m" {
					t.Fatalf("incomplete rejection %+v", r)
				}
			}
			return
		}
		checkMesh(t, tm)
	})
}
