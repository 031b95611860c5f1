package clustermesh

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func keptMesh(remoteNets ...string) *ClusterMesh {
	return &ClusterMesh{
		ObjectMeta: metav1.ObjectMeta{Name: "prod", Namespace: "kilo-system"},
		Spec: ClusterMeshSpec{Clusters: []Cluster{
			{Name: "a", Local: true, AllowedNetworks: []string{"10.1.0.0/16"}},
			{Name: "b", AllowedNetworks: remoteNets, KubeconfigSecretRef: &SecretKeyRef{Name: "b"}},
		}},
	}
}

func TestKeeperKeepsLastGoodVersion(t *testing.T) {
	var k Keeper
	for _, step := range []struct {
		name        string
		meshes      []*ClusterMesh
		wantNets    string // b's networks in force, "" = no mesh
		wantRejects bool
	}{
		{"accepted", []*ClusterMesh{keptMesh("10.2.0.0/16")}, "[10.2.0.0/16]", false},
		{"bad edit: overlap with a", []*ClusterMesh{keptMesh("10.1.5.0/24")}, "[10.2.0.0/16]", true},
		{"bad edit: not a CIDR", []*ClusterMesh{keptMesh("nope")}, "[10.2.0.0/16]", true},
		{"good edit", []*ClusterMesh{keptMesh("10.3.0.0/16")}, "[10.3.0.0/16]", false},
		{"deleted", nil, "", false},
		{"bad from the start: nothing to keep", []*ClusterMesh{keptMesh("10.1.0.0/16")}, "", true},
	} {
		res := k.Resolve(step.meshes, "")
		got := ""
		if len(res.Meshes) == 1 {
			got = toString(res.Meshes[0].Clusters[1].AllowedNetworks)
		}
		if got != step.wantNets || (len(res.Rejections) > 0) != step.wantRejects {
			t.Errorf("%s: networks %q rejections %v, want %q rejected=%v", step.name, got, res.Rejections, step.wantNets, step.wantRejects)
		}
		if step.wantNets != "" && len(res.Kubeconfigs) != 1 {
			t.Errorf("%s: kubeconfigs = %v", step.name, res.Kubeconfigs)
		}
	}
}

func toString[T interface{ String() string }](xs []T) string {
	s := "["
	for i, x := range xs {
		if i > 0 {
			s += " "
		}
		s += x.String()
	}
	return s + "]"
}
