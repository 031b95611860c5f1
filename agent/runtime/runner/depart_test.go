package runner_test

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/runner"
	"github.com/meshlet/meshlet/e2e/apiserver"
	"github.com/meshlet/meshlet/netlinkx"
)

type recordingCleaner struct{ opts []netlinkx.CleanupOptions }

type recordingForgetter struct{ calls int }

func (f *recordingForgetter) ForgetLearnedEndpoints(context.Context) ([]string, error) {
	f.calls++
	return nil, nil
}

func (c *recordingCleaner) Cleanup(_ context.Context, o netlinkx.CleanupOptions) error {
	c.opts = append(c.opts, o)
	return nil
}

// TestLeavingAndDepart: with kg's --clean-up, an agent that stops tells an
// uninstall (its DaemonSet gone or no longer running on this node; without
// the grants to read it, its RBAC or credentials gone) from a rolling
// update or restart, and Depart removes its host state and annotations
// (meshlet's leader mark, not a user's leader annotation).
func TestLeavingAndDepart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver")
	}
	ctx := context.Background()
	srv, admin := grantsCluster(t, "cluster-b-kubeconfig")
	// The lifecycle grants of the add-on (manifests/dropin).
	applyBytes(t, srv, `apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: meshlet-lifecycle, namespace: kilo-system}
rules:
- {apiGroups: [""], resources: [pods], verbs: [list]}
- {apiGroups: [apps], resources: [daemonsets], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: meshlet-lifecycle, namespace: kilo-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: meshlet-lifecycle}
subjects: [{kind: ServiceAccount, name: meshlet, namespace: kilo-system}]
`)
	// The DaemonSet and this node's pod of it, as the controllers would
	// make them (no kubelet here).
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "kilo", Namespace: "kilo-system"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "kilo"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "kilo"}},
				Spec: corev1.PodSpec{ServiceAccountName: "meshlet", Containers: []corev1.Container{{Name: "kilo", Image: "meshlet"}}}}}}
	ds, err := admin.AppsV1().DaemonSets("kilo-system").Create(ctx, ds, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "kilo-abcde", Namespace: "kilo-system",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "kilo", UID: ds.UID, Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: "a-1", ServiceAccountName: "meshlet", Containers: []corev1.Container{{Name: "kilo", Image: "meshlet"}}}}
	if _, err := admin.CoreV1().Pods("kilo-system").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sa := srv.ServiceAccountConfig(ctx, "kilo-system", "meshlet")
	sa.UserAgent = "meshlet/test"
	if err := apiserver.WaitAuthorized(ctx, sa, apiserver.AgentGrants("kilo-system")...); err != nil {
		t.Fatal(err)
	}
	leaving := func(t *testing.T) (bool, string) {
		t.Helper()
		a := startedAgent(t, ctx, sa)
		return a.Leaving(ctx)
	}

	t.Run("a new agent follows", func(t *testing.T) {
		if l, why := leaving(t); l || !strings.Contains(why, "starts a new agent") {
			t.Fatalf("leaving %v (%s), want false", l, why)
		}
	})
	t.Run("a new meshlet image follows", func(t *testing.T) {
		cur, _ := admin.AppsV1().DaemonSets("kilo-system").Get(ctx, "kilo", metav1.GetOptions{})
		cur.Spec.Template.Spec.Containers[0].Image = "meshlet:v2"
		if _, err := admin.AppsV1().DaemonSets("kilo-system").Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if l, why := leaving(t); l {
			t.Fatalf("leaving %v (%s), want false", l, why)
		}
	})
	t.Run("the way back: kg's image follows", func(t *testing.T) {
		cur, _ := admin.AppsV1().DaemonSets("kilo-system").Get(ctx, "kilo", metav1.GetOptions{})
		cur.Spec.Template.Spec.Containers[0].Image = "squat/kilo:0.7.0"
		if _, err := admin.AppsV1().DaemonSets("kilo-system").Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		a := startedAgent(t, ctx, sa)
		if l, why := a.Leaving(ctx); !l || !strings.Contains(why, "squat/kilo:0.7.0") {
			t.Fatalf("leaving %v (%s), want true", l, why)
		}
		// kg takes the node over: meshlet's marks go, Kilo's annotations
		// (which kg publishes again) stay, so the other nodes keep this
		// one as their peer meanwhile.
		patchAnnotations(t, admin, "a-1", map[string]string{topology.AnnotationLeader: topology.LeaderLeaseValue,
			topology.AnnotationVersion: "v1", topology.AnnotationTunnels: "up"})
		if err := a.Depart(ctx, &recordingCleaner{}, &recordingForgetter{}, false); err != nil {
			t.Fatal(err)
		}
		n, err := admin.CoreV1().Nodes().Get(ctx, "a-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{topology.AnnotationLeader, topology.AnnotationVersion, topology.AnnotationTunnels, topology.AnnotationSeen} {
			if v, ok := n.Annotations[k]; ok {
				t.Errorf("meshlet's %s=%q left for kg", k, v)
			}
		}
		for _, k := range []string{topology.AnnotationKey, topology.AnnotationLastSeen, topology.AnnotationWireGuardIP} {
			if n.Annotations[k] == "" {
				t.Errorf("Kilo's %s removed though kg takes the node over: %v", k, n.Annotations)
			}
		}
		cur, _ = admin.AppsV1().DaemonSets("kilo-system").Get(ctx, "kilo", metav1.GetOptions{})
		cur.Spec.Template.Spec.Containers[0].Image = "meshlet"
		if _, err := admin.AppsV1().DaemonSets("kilo-system").Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("the DaemonSet no longer selects the node", func(t *testing.T) {
		cur, _ := admin.AppsV1().DaemonSets("kilo-system").Get(ctx, "kilo", metav1.GetOptions{})
		cur.Spec.Template.Spec.NodeSelector = map[string]string{"kilo": "yes"}
		if _, err := admin.AppsV1().DaemonSets("kilo-system").Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if l, why := leaving(t); !l || !strings.Contains(why, "no longer runs") {
			t.Fatalf("leaving %v (%s), want true", l, why)
		}
	})
	t.Run("the DaemonSet is gone", func(t *testing.T) {
		if err := admin.AppsV1().DaemonSets("kilo-system").Delete(ctx, "kilo", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if l, why := leaving(t); !l || !strings.Contains(why, "is gone") {
			t.Fatalf("leaving %v (%s), want true", l, why)
		}
	})
	t.Run("kg's grants alone: no sign of an uninstall", func(t *testing.T) {
		if err := admin.RbacV1().RoleBindings("kilo-system").Delete(ctx, "meshlet-lifecycle", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(15 * time.Second)
		for {
			l, why := leaving(t)
			if !l && strings.Contains(why, "no sign of an uninstall") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("leaving %v (%s), want false with no sign", l, why)
			}
			waitTick()
		}
	})
	t.Run("Depart removes the host state and meshlet's annotations", func(t *testing.T) {
		mark := map[string]string{topology.AnnotationLeader: topology.LeaderLeaseValue, topology.AnnotationVersion: "v1",
			topology.AnnotationTunnels: "up", topology.AnnotationLocation: "x"}
		patchAnnotations(t, admin, "a-1", mark)
		a := startedAgent(t, ctx, sa)
		c, f := &recordingCleaner{}, &recordingForgetter{}
		if err := a.Depart(ctx, c, f, true); err != nil {
			t.Fatal(err)
		}
		if len(c.opts) != 1 || !c.opts[0].DeleteInterface {
			t.Errorf("cleanup %+v", c.opts)
		}
		if f.calls != 0 {
			t.Errorf("the device readied for kg %d times while deleting it", f.calls)
		}
		n, err := admin.CoreV1().Nodes().Get(ctx, "a-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{topology.AnnotationLeader, topology.AnnotationVersion, topology.AnnotationTunnels, topology.AnnotationKey, topology.AnnotationLastSeen} {
			if v, ok := n.Annotations[k]; ok {
				t.Errorf("%s=%q left", k, v)
			}
		}
		if n.Annotations[topology.AnnotationLocation] != "x" {
			t.Error("the user's location annotation was removed")
		}
		// A user's leader annotation stays.
		patchAnnotations(t, admin, "a-1", map[string]string{topology.AnnotationLeader: "true"})
		a = startedAgent(t, ctx, sa)
		if err := a.Depart(ctx, c, f, false); err != nil {
			t.Fatal(err)
		}
		// The device stays for kg: readied for it once (what that does:
		// wg.TestForgetLearnedEndpoints).
		if f.calls != 1 {
			t.Errorf("the device readied for kg %d times, want once", f.calls)
		}
		n, _ = admin.CoreV1().Nodes().Get(ctx, "a-1", metav1.GetOptions{})
		if n.Annotations[topology.AnnotationLeader] != "true" {
			t.Errorf("a user's leader annotation was removed: %v", n.Annotations)
		}
	})
}

// startedAgent runs an agent until its loop is ready and stops it, for
// what an agent does when it exits.
func startedAgent(t *testing.T, ctx context.Context, cfg *rest.Config) *runner.Agent {
	t.Helper()
	a := newAgent(t, cfg)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(rctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for !a.Loop.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("agent not ready")
		}
		waitTick()
	}
	// The self node as the agent saw it last, for Depart's mark check.
	for a.Local.SelfNode() == nil || len(a.Local.SelfNode().Annotations) == 0 {
		waitTick()
	}
	cancel()
	<-done
	return a
}
