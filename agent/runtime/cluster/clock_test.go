package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/planner"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/e2e/apiserver"
)

// TestRemoteLivenessOnOneClock follows a remote node's last-seen from a
// real API server through the watchers to the planner, every stamp taken
// from one fake clock and no real time waited for (docs/architecture.md#one-clock):
// the remote cluster's clock runs 5 minutes ahead of this agent's, which
// changes nothing but the skew reported; the node that stops refreshing
// its last-seen leaves the plan once the fake clock has moved Kilo's ready
// window past when its last change was heard, not a moment before; its
// neighbour, refreshed all along, leads the location as soon as it says so.
func TestRemoteLivenessOnOneClock(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two kube-apiservers")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	local := startAPI(ctx, t, "manifests/namespace/namespace.yaml", "manifests/crds/peers.kilo.squat.ai.yaml", "manifests/crds/clustermeshes.kilo.squat.ai.yaml")
	remote := startAPI(ctx, t, "manifests/crds/peers.kilo.squat.ai.yaml")
	mesh := []byte(`
apiVersion: kilo.squat.ai/v1alpha1
kind: ClusterMesh
metadata: {name: prod, namespace: kilo-system}
spec:
  clusters:
  - {name: cluster-a, local: true, allowedNetworks: [10.244.0.0/16]}
  - name: cluster-b
    kubeconfigSecretRef: {name: cluster-b-kubeconfig, key: kubeconfig}
    allowedNetworks: [10.2.0.0/16]
`)
	if _, err := apiserver.Apply(ctx, local.AdminConfig(), mesh, apiserver.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}

	clk := testingclock.NewFakeClock(time.Unix(1_800_000_000, 0))
	ahead := 5 * time.Minute // the remote cluster's clock
	ladmin := kubernetes.NewForConfigOrDie(local.AdminConfig())
	radmin := kubernetes.NewForConfigOrDie(remote.AdminConfig())
	mk := func(name, loc, priv, pod string, k byte, lastSeen time.Time) *corev1.Node {
		var key topology.Key
		key[0], key[31] = k, 0x42
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{
			topology.AnnotationKey: key.String(), topology.AnnotationEndpoint: priv + ":51820", topology.AnnotationInternalIP: priv + "/24",
			topology.AnnotationLocation: loc, topology.AnnotationLastSeen: fmt.Sprint(lastSeen.Unix())}},
			Spec: corev1.NodeSpec{PodCIDR: pod, PodCIDRs: []string{pod}}}
	}
	if _, err := ladmin.CoreV1().Nodes().Create(ctx, mk("a-1", "x", "192.168.1.1", "10.244.1.0/24", 1, clk.Now()), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"b-1", "b-2"} {
		n := mk(name, "z", fmt.Sprintf("172.16.0.%d", i+1), fmt.Sprintf("10.2.%d.0/24", i+1), byte(11+i), clk.Now().Add(ahead))
		if name == "b-1" { // the leader of cluster-b's location z
			n.Annotations[topology.AnnotationWireGuardIP] = "10.2.255.1/24"
		}
		if _, err := radmin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	wake := make(chan struct{}, 1)
	notify := func(time.Time) {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	lw, err := cluster.NewLocal(cluster.LocalOptions{Config: local.AdminConfig(), Client: ladmin, Namespace: "kilo-system", Node: "a-1",
		Notify: notify, Log: log, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	lw.Start(ctx)
	if !lw.WaitForSync(ctx) {
		t.Fatal("local caches not synced")
	}
	kc, err := apiserver.Kubeconfig(remote.AdminConfig(), "cluster-b")
	if err != nil {
		t.Fatal(err)
	}
	rs := &cluster.Remotes{Notify: notify, Log: log, Clock: clk,
		Secrets: cluster.SecretFunc(func(string, string) ([]byte, bool) { return kc, true })}
	rs.Start(ctx)
	src := &cluster.Source{Local: lw, Remotes: rs, ClusterName: "cluster-a"}

	var self topology.Key
	self[0], self[31] = 1, 0x42
	plan := func() topology.Plan {
		snap, _ := src.Snapshot()
		snap.Now = clk.Now() // as the loop does, from the same clock
		snap.Settings = topology.Settings{ClusterName: "cluster-a", Subnet: netip.MustParsePrefix("10.4.0.0/16"), Granularity: topology.GranularityLocation,
			Encapsulate: topology.EncapsulateNever, Local: true}
		return planner.Compute(snap, topology.Self{Name: "a-1", PublicKey: self, DefaultInterface: "eth0",
			Addresses: []topology.HostAddress{{Interface: "eth0", Prefix: netip.MustParsePrefix("192.168.1.1/24")}}})
	}
	remoteLeader := func(p topology.Plan) string {
		for _, peer := range p.WireGuard.Peers {
			if peer.Kind == topology.KindRemote {
				return peer.Name
			}
		}
		return ""
	}
	// until waits until the plan satisfies ok (the wait's deadline is the
	// assertion): on the watchers' notifications, and polling, since a
	// last-seen refresh alone is heard without waking anyone (store.go).
	until := func(what string, ok func(topology.Plan) bool) topology.Plan {
		t.Helper()
		deadline := time.NewTimer(30 * time.Second)
		defer deadline.Stop()
		poll := time.NewTicker(20 * time.Millisecond)
		defer poll.Stop()
		for {
			rs.Reconcile(true, []clustermesh.Kubeconfig{{Cluster: "cluster-b", Name: "cluster-b-kubeconfig", Key: "kubeconfig"}})
			if p := plan(); ok(p) {
				return p
			}
			select {
			case <-wake:
			case <-poll.C:
			case <-deadline.C:
				p := plan()
				snap, _ := src.Snapshot()
				t.Fatalf("%s: not reached; remote peer %q, rejections %v; remote clusters %+v", what, remoteLeader(p), p.Rejections, snap.Remotes)
			}
		}
	}
	refresh := func(name string, extra ...string) {
		t.Helper()
		ann := map[string]string{topology.AnnotationLastSeen: fmt.Sprint(clk.Now().Add(ahead).Unix())}
		for i := 0; i+1 < len(extra); i += 2 {
			ann[extra[i]] = extra[i+1]
		}
		b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
		if _, err := radmin.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	heard := func(name string, at time.Time) func(topology.Plan) bool {
		return func(topology.Plan) bool {
			for _, rc := range func() []topology.RemoteCluster { s, _ := rs.State(); return s }() {
				for _, n := range rc.Nodes {
					if n.Name == name && n.Heard.Equal(at) {
						return true
					}
				}
			}
			return false
		}
	}

	// Both remote nodes are Ready although their last-seen lies 5 minutes
	// in this agent's future: they are judged by their cluster's clock.
	until("cluster-b's leader b-1 a peer", func(p topology.Plan) bool { return remoteLeader(p) == "b-1" })

	// The remote cluster's agents refresh their last-seen 10 s later (by
	// both clocks): heard at this clock's time, the skew is measured.
	clk.Step(10 * time.Second)
	refresh("b-1")
	refresh("b-2")
	lastB1 := clk.Now()
	until("b-1's change heard", heard("b-1", lastB1))
	until("b-2's change heard", heard("b-2", lastB1))
	if st := rs.Status(); len(st) != 1 || st[0].ClockSkew == nil || (*st[0].ClockSkew-ahead).Abs() > time.Second {
		t.Errorf("remote status %+v, want a clock skew of %v ±1 s", st, ahead)
	}

	// b-1's agent stops; b-2's goes on refreshing every 30 s.
	clk.Step(30 * time.Second)
	refresh("b-2")
	until("b-2's second change heard", heard("b-2", clk.Now()))
	clk.Step(topology.ReadyWindow - 30*time.Second - time.Second) // 1 s inside b-1's window
	if p := plan(); remoteLeader(p) != "b-1" {
		t.Fatalf("b-1 dropped %v after its last change was heard, inside Kilo's %v window (remote peer %q)",
			clk.Since(lastB1), topology.ReadyWindow, remoteLeader(p))
	}
	clk.Step(time.Second)
	until("b-1 out of the plan", func(p topology.Plan) bool { return remoteLeader(p) == "" })
	if clk.Since(lastB1) != topology.ReadyWindow {
		t.Errorf("b-1 left the plan %v after it was last heard, want exactly %v", clk.Since(lastB1), topology.ReadyWindow)
	}
	// cluster-b's agents hand location z to b-2, which publishes its
	// WireGuard IP: heard on the same clock, it is a peer at once.
	refresh("b-2", topology.AnnotationWireGuardIP, "10.2.255.1/24")
	until("b-2 leading location z", func(p topology.Plan) bool { return remoteLeader(p) == "b-2" })
}

// startAPI starts a kube-apiserver with the repository's manifests files
// applied.
func startAPI(ctx context.Context, t *testing.T, files ...string) *apiserver.Server {
	t.Helper()
	srv := apiserver.Start(t, apiserver.Options{})
	for _, f := range files {
		if _, err := apiserver.ApplyFile(ctx, srv.AdminConfig(), repoFile(f), apiserver.ApplyOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return srv
}

func repoFile(rel string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", rel)
}
