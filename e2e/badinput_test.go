package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/harness"
)

// Scenario 7: bad input is rejected visibly (an Event and
// meshlet_rejections_total) and everything else keeps working: a Peer with
// a bad key, a remote node claiming 0.0.0.0/0 and the local pod CIDR, a
// malformed force-endpoint (remote and local), an overlapping ClusterMesh.
func TestBadInput(t *testing.T) {
	env, ctx := newEnv(t)
	must(t, env.Build(ctx, harness.Small(1, "z")))
	a1, z1 := env.Node("a-x1"), env.Node("b-z1")
	a, b := env.Cluster("cluster-a"), env.Cluster("cluster-b")
	_, err := a1.WaitReachable(ctx, z1.PodIP, 30*time.Second)
	must(t, err)

	must(t, a.Apply(ctx, `{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"bad-key"},
"spec":{"allowedIPs":["10.9.0.7/32"],"publicKey":"not-a-key"}}`))
	evilIPs := "0.0.0.0/0," + a1.PodCIDR.String()
	_, err = b.AddFakeNode(ctx, harness.FakeNode{Name: "b-evil", Location: "e", Endpoint: "172.20.0.201:51820",
		WireGuardIP: "100.66.1.50/24", Extra: map[string]string{topology.AnnotationAllowedLocationIPs: evilIPs}})
	must(t, err)
	_, err = b.AddFakeNode(ctx, harness.FakeNode{Name: "b-badep", Location: "f", Endpoint: "172.20.0.202:51820",
		WireGuardIP: "100.66.1.51/24", Extra: map[string]string{topology.AnnotationForceEndpoint: "not an endpoint"}})
	must(t, err)
	_, err = a.AddFakeNode(ctx, harness.FakeNode{Name: "a-badep", Location: "q", Endpoint: "172.20.0.203:51820",
		Extra: map[string]string{topology.AnnotationForceEndpoint: "[::1:51820"}})
	must(t, err)
	// A second mesh, sorted after "mesh", whose cluster-c overlaps cluster-b.
	must(t, a.Apply(ctx, fmt.Sprintf(`{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"ClusterMesh",
"metadata":{"name":"zz-overlap","namespace":"%s"},"spec":{"clusters":[
 {"name":"cluster-a","local":true,"allowedNetworks":["%s","%s"]},
 {"name":"cluster-c","kubeconfigSecretRef":{"name":"cluster-c-kubeconfig","key":"kubeconfig"},"allowedNetworks":["10.2.128.0/17"]}]}}`,
		harness.Namespace, a.PodNet, a.WGSubnet)))

	wants := []eventWant{
		{"Peer", "bad-key", []string{string(topology.ReasonInvalidKey)}, ""},
		{"ClusterMesh", "mesh", []string{string(topology.ReasonDefaultRoute)}, "b-evil"},
		{"ClusterMesh", "mesh", []string{string(topology.ReasonOverlapsLocal)}, "b-evil"},
		{"ClusterMesh", "mesh", []string{string(topology.ReasonInvalidEndpoint)}, "b-badep"},
		{"Node", "a-badep", []string{string(topology.ReasonInvalidEndpoint), string(topology.ReasonInvalidAnnotation)}, ""},
		{"ClusterMesh", "zz-overlap", []string{string(topology.ReasonNetworksOverlap), string(topology.ReasonMeshConflict)}, ""},
	}
	start := time.Now()
	matched := len(wants)
	if _, err := awaitEvents(t, ctx, a, 30*time.Second, "an Event per bad input", wants); err != nil {
		t.Error(err)
		matched = 0 // the error names those missing
	}
	eventsTook := time.Since(start)

	m, err := a1.Metrics(ctx)
	must(t, err)
	var counts []string
	for _, r := range []topology.Reason{topology.ReasonInvalidKey, topology.ReasonDefaultRoute, topology.ReasonOverlapsLocal,
		topology.ReasonInvalidEndpoint, topology.ReasonNetworksOverlap} {
		v, _ := m.Value("meshlet_rejections_total", "reason", string(r))
		counts = append(counts, fmt.Sprintf("%s=%v", r, v))
		if v < 1 {
			t.Errorf("meshlet_rejections_total{reason=%q} = %v on a-x1", r, v)
		}
	}

	// Nothing bad reached the data plane; the good path still works.
	d, err := a1.Device()
	must(t, err)
	for _, p := range d.Peers {
		for _, ip := range p.AllowedIPs {
			if ip == "0.0.0.0/0" || ip == a1.PodCIDR.String() {
				t.Errorf("peer %s got allowed IP %s", p.PublicKey, ip)
			}
		}
	}
	routes, err := a1.Routes(ctx)
	must(t, err)
	for _, r := range routes {
		if strings.HasPrefix(r, "default") || strings.HasPrefix(r, a1.PodCIDR.String()) {
			t.Errorf("a-x1 has route %q", r)
		}
	}
	if _, err = a1.WaitReachable(ctx, z1.PodIP, 10*time.Second); err != nil {
		for _, n := range []*harness.Node{a1, z1} {
			d, _ := n.Device()
			rs, _ := n.Routes(ctx)
			t.Logf("%s device: %+v\nroutes:\n%s", n.Name, d, strings.Join(rs, "\n"))
		}
		bevs, _ := b.Admin.CoreV1().Events("").List(ctx, metav1.ListOptions{})
		for _, e := range bevs.Items {
			t.Logf("cluster-b event %s/%s %s: %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
		t.Fatal(err)
	}
	report(t, "6 bad inputs → %d matching Events within %v; meshlet_rejections_total on a-x1: %s; cross-cluster ping still answered",
		matched, eventsTook.Round(time.Millisecond), strings.Join(counts, " "))
}
