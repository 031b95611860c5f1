package cluster_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
)

// TestPublisherLeaderMarks: the Publisher, the one writer of Nodes, on a
// real API server and with the agent's own credentials (the shipped RBAC):
// the holder's leader mark goes out with its annotations; Unmark removes
// meshlet's mark from the nodes named and never a user's leader
// annotation (x-3's, which the agent sees; x-4's, written after the
// agent's view: the JSON patch tests the value on the server) —
// docs/failover.md#marks.
func TestPublisherLeaderMarks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := startAPI(ctx, t, "manifests/namespace/namespace.yaml", "manifests/base/rbac.yaml",
		"manifests/crds/peers.kilo.squat.ai.yaml", "manifests/crds/clustermeshes.kilo.squat.ai.yaml")
	admin := kubernetes.NewForConfigOrDie(srv.AdminConfig())
	mark := topology.LeaderLeaseValue
	for name, leader := range map[string]string{"x-1": "", "x-2": mark, "x-3": "true", "x-4": mark} {
		ann := map[string]string{}
		if leader != "" {
			ann[topology.AnnotationLeader] = leader
		}
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	agentCfg := srv.ServiceAccountConfig(ctx, "kilo-system", "meshlet")
	agent := kubernetes.NewForConfigOrDie(agentCfg)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	local, err := cluster.NewLocal(cluster.LocalOptions{Config: agentCfg, Client: agent, Namespace: "kilo-system", Node: "x-1", Log: log})
	if err != nil {
		t.Fatal(err)
	}
	// The informer lists once and stops: its view stays as created, so
	// the user's later change below is one the agent has not seen.
	listed, stop := context.WithCancel(ctx)
	local.Start(listed)
	if !local.WaitForSync(ctx) {
		t.Fatal("local caches not synced")
	}
	stop()
	pub := &cluster.Publisher{Client: agent, Local: local, Node: "x-1"}
	leaderOf := func(n string) (string, bool) {
		t.Helper()
		o, err := admin.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v, ok := o.Annotations[topology.AnnotationLeader]
		return v, ok
	}

	// x-1 holds the Lease: its mark goes out with its annotations.
	if patched, err := pub.Publish(ctx, map[string]string{topology.AnnotationLeader: mark,
		topology.AnnotationLastSeen: fmt.Sprint(time.Now().Unix())}); err != nil || !patched {
		t.Fatalf("publish: patched %v, %v", patched, err)
	}
	if v, _ := leaderOf("x-1"); v != mark {
		t.Errorf("x-1's leader annotation %q, want %q", v, mark)
	}

	// A user turns x-4's mark into their own, unseen by the agent, which
	// still sees meshlet's: the server's test refuses the removal.
	user := fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, topology.AnnotationLeader)
	if _, err := admin.CoreV1().Nodes().Patch(ctx, "x-4", types.MergePatchType, []byte(user), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	removed, err := pub.Unmark(ctx, []string{"x-2", "x-3", "x-4", "gone"})
	if err != nil {
		t.Fatal(err)
	}
	if removed != 1 {
		t.Errorf("%d marks removed, want 1 (x-2's)", removed)
	}
	if v, ok := leaderOf("x-2"); ok {
		t.Errorf("x-2 still carries a leader annotation %q", v)
	}
	for _, n := range []string{"x-3", "x-4"} {
		if v, _ := leaderOf(n); v != "true" {
			t.Errorf("the user's leader annotation on %s became %q", n, v)
		}
	}
	if v, _ := leaderOf("x-1"); v != mark {
		t.Errorf("x-1's own mark became %q", v)
	}
}
