package runner_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/config"
	"github.com/meshlet/meshlet/agent/runtime/runner"
	"github.com/meshlet/meshlet/e2e/apiserver"
)

// TestAgentUnderTheAdmissionPolicy: the agent, with its pod's token (bound
// to a pod on a-1, as kubelet asks for it) and the shipped RBAC and
// admission policy (manifests/components/admission), does all it does in a
// governed location — publishes its annotations, takes the location's
// Lease, removes meshlet's leader mark from the former holder a-2 — and the
// API server refuses none of its requests, while the policy is in force.
func TestAgentUnderTheAdmissionPolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := apiserver.Start(t, apiserver.Options{})
	applyFiles(t, srv.AdminConfig(), "manifests/namespace/namespace.yaml", "manifests/crds/peers.kilo.squat.ai.yaml",
		"manifests/crds/clustermeshes.kilo.squat.ai.yaml", "manifests/base/rbac.yaml", "manifests/components/admission/policy.yaml")
	admin := kubernetes.NewForConfigOrDie(srv.AdminConfig())
	now := fmt.Sprint(time.Now().Unix())
	for _, n := range []*corev1.Node{
		node("a-1", "x", "192.168.1.1/24", "10.244.1.0/24", key(1), nil),
		// a-2 held the Lease before (its meshlet mark) and has not published
		// for a while: a-1 takes the Lease and clears the mark.
		node("a-2", "x", "192.168.1.2/24", "10.244.2.0/24", key(2), map[string]string{
			topology.AnnotationVersion: "v0", topology.AnnotationSeen: now, topology.AnnotationLastSeen: now,
			topology.AnnotationLeader: topology.LeaderLeaseValue}),
	} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod, err := admin.CoreV1().Pods("kilo-system").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "meshlet-a-1"},
		Spec: corev1.PodSpec{ServiceAccountName: "meshlet", NodeName: "a-1", Containers: []corev1.Container{{Name: "meshlet", Image: "meshlet"}}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	exp := int64(3600)
	tr, err := admin.CoreV1().ServiceAccounts("kilo-system").CreateToken(ctx, "meshlet", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &exp, BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := srv.TokenConfig(tr.Status.Token)
	cfg.UserAgent = "meshlet/test"
	if err := apiserver.WaitAuthorized(ctx, cfg, apiserver.AgentGrants("kilo-system")...); err != nil {
		t.Fatal(err)
	}
	// The policy in force: a-1's token may not touch a-2's key.
	probe := kubernetes.NewForConfigOrDie(cfg)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := probe.CoreV1().Nodes().Patch(ctx, "a-2", types.MergePatchType, []byte(`{"metadata":{"annotations":{"kilo.squat.ai/key":"x"}}}`),
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'meshlet'") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the policy is not in force: %v", err)
		}
		waitTick()
	}
	from := time.Now()

	// a-1's agent (tryAgent's, publishing a version: a node run by meshlet).
	var c config.Config
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	c.RegisterTopology(fs)
	c.RegisterAgent(fs)
	c.Namespace, c.Local, c.TopologyLabel = "kilo-system", true, "topology.kubernetes.io/region"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	a, err := runner.New(runner.Options{Config: c, Node: "a-1", RestConfig: cfg, WireGuard: newFakeWG(), Host: fakeHost{},
		Self: fakeSelf{topology.Self{PublicKey: key(1), DefaultInterface: "eth0", Version: "v1",
			Addresses: []topology.HostAddress{{Interface: "eth0", Prefix: netip.MustParsePrefix("192.168.1.1/24")}}}},
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	rctx, stop := context.WithCancel(ctx)
	go func() { done <- a.Run(rctx) }()
	defer func() { stop(); <-done }()
	deadline = time.Now().Add(60 * time.Second)
	for {
		l, lerr := admin.CoordinationV1().Leases("kilo-system").Get(ctx, "meshlet-leader-x", metav1.GetOptions{})
		a1, _ := admin.CoreV1().Nodes().Get(ctx, "a-1", metav1.GetOptions{})
		a2, _ := admin.CoreV1().Nodes().Get(ctx, "a-2", metav1.GetOptions{})
		held := lerr == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == "a-1"
		marked := a1 != nil && a1.Annotations[topology.AnnotationLeader] == topology.LeaderLeaseValue && a1.Annotations[topology.AnnotationVersion] != ""
		unmarked := a2 != nil && a2.Annotations[topology.AnnotationLeader] == ""
		if held && marked && unmarked {
			break
		}
		if time.Now().After(deadline) {
			refused, _ := srv.Forbidden(apiserver.ByMeshlet)
			t.Fatalf("a-1 holds the Lease %v, carries the mark and its annotations %v, a-2's mark removed %v (Lease %v; a-1 %v; a-2 %v; refused %q; status %+v)",
				held, marked, unmarked, l, a1.Annotations, a2.Annotations, refused, a.Status(ctx).Leadership)
		}
		waitTick()
	}
	refused, err := srv.Forbidden(apiserver.ByMeshlet)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range refused {
		if at, err := time.Parse(time.RFC3339Nano, strings.Fields(line)[0]); err != nil || at.After(from) {
			t.Errorf("refused: %s", line)
			n++
		}
	}
	t.Logf("RESULT under the admission policy a-1's agent published its annotations, took the Lease and unmarked a-2; %d of its requests refused", n)
}
