package manifests_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/meshlet/meshlet/e2e/apiserver"
)

// The agent confined to its own node (manifests/components/admission,
// docs/security.md#admission), on a real kube-apiserver: tokens of the
// agent's ServiceAccount bound to a Pod on node n-a (TokenRequest with a
// Pod boundObjectRef, as kubelet asks for the pod's projected token; no
// kubelet runs) and on n-b, every write the agent makes and those it must
// not, through the shipped manifests (manifests/) and through the drop-in
// with its add-on (manifests/dropin/admission) on Kilo's RBAC. Then the
// policy's binding is deleted: every request it denied goes through —
// RBAC alone would allow them all.
func TestAdmissionConfinesTheAgent(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver")
	}
	for _, shape := range []struct {
		name, dir, namespace, sa, binding string
		// extra are applied first (Kilo's RBAC for the drop-in).
		extra []string
	}{
		{name: "manifests", dir: ".", namespace: ns, sa: "meshlet", binding: "meshlet"},
		{name: "dropin", dir: "dropin/admission", namespace: "kube-system", sa: "kilo", binding: "meshlet-dropin",
			extra: []string{"../agent/runtime/runner/testdata/kilo-rbac.yaml"}},
	} {
		t.Run(shape.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			srv := apiserver.Start(t, apiserver.Options{})
			admin := srv.AdminConfig()
			cs := kubernetes.NewForConfigOrDie(admin)
			var objs []byte
			for _, f := range shape.extra {
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				objs = append(append(objs, b...), "\n---\n"...)
			}
			objs = append(objs, kustomizeBuild(t, shape.dir)...)
			if shape.namespace == ns {
				objs = append(append(kustomizeBuild(t, "namespace"), "\n---\n"...), objs...)
			}
			if _, err := apiserver.Apply(ctx, admin, objs, apiserver.ApplyOptions{}); err != nil {
				t.Fatalf("applying %s: %v", shape.dir, err)
			}
			confinement(ctx, t, srv, cs, shape.namespace, shape.sa, shape.binding)
		})
	}
}

// confinement is the test of one install shape: the agent's ServiceAccount
// sa in namespace, the policy bound by binding.
func confinement(ctx context.Context, t *testing.T, srv *apiserver.Server, cs kubernetes.Interface, namespace, sa, binding string) {
	nodes := cs.CoreV1().Nodes()
	for _, n := range []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "n-a", Labels: map[string]string{"topology.kubernetes.io/region": "x"},
			Annotations: map[string]string{"kilo.squat.ai/location": "x"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "n-b", Labels: map[string]string{"topology.kubernetes.io/region": "x"},
			Annotations: map[string]string{"kilo.squat.ai/location": "x", "kilo.squat.ai/key": "b-key", "kilo.squat.ai/leader": "meshlet.io/lease"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "n-c", Annotations: map[string]string{"kilo.squat.ai/leader": "true"}}},
	} {
		if _, err := nodes.Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	leases := cs.CoordinationV1().Leases(namespace)
	kcm, secs := "kube-controller-manager-host", int32(15)
	if _, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "kube-controller-manager"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &kcm, LeaseDurationSeconds: &secs}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The agents' tokens: bound to a pod on n-a and one on n-b, as kubelet
	// asks for them; and one bound to nothing (a legacy token, or an
	// admin's TokenRequest), which names no node.
	token := func(node string) string { return podToken(ctx, t, cs, namespace, sa, node) }
	agents := map[string]kubernetes.Interface{}
	for _, n := range []string{"n-a", "n-b"} {
		agents[n] = kubernetes.NewForConfigOrDie(srv.TokenConfig(token(n)))
	}
	unbound, err := srv.ServiceAccountToken(ctx, namespace, sa)
	if err != nil {
		t.Fatal(err)
	}
	agents["unbound"] = kubernetes.NewForConfigOrDie(srv.TokenConfig(unbound))
	// What the API server says the pod-bound token is.
	review, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token("n-a")}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a token bound to a pod on n-a: user %s, extra %v", review.Status.User.Username, review.Status.User.Extra)
	if got := review.Status.User.Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != "n-a" {
		t.Fatalf("the pod-bound token's node-name claim is %v, want [n-a]", got)
	}

	merge := func(node, patch string) func(kubernetes.Interface, []string) error {
		return func(c kubernetes.Interface, dry []string) error {
			_, err := c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{DryRun: dry})
			return err
		}
	}
	unmark := func(node string) func(kubernetes.Interface, []string) error {
		return func(c kubernetes.Interface, dry []string) error {
			_, err := c.CoreV1().Nodes().Patch(ctx, node, types.JSONPatchType,
				[]byte(`[{"op":"test","path":"/metadata/annotations/kilo.squat.ai~1leader","value":"meshlet.io/lease"},{"op":"remove","path":"/metadata/annotations/kilo.squat.ai~1leader"}]`),
				metav1.PatchOptions{DryRun: dry})
			return err
		}
	}
	// lease changes a Lease as the agents' electors do: read, change,
	// update with the resourceVersion read; create when missing.
	lease := func(name string, change func(l *coordinationv1.Lease)) func(kubernetes.Interface, []string) error {
		return func(c kubernetes.Interface, dry []string) error {
			l, err := leases.Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace,
					Labels: map[string]string{"app.kubernetes.io/part-of": "meshlet"}}}
				change(l)
				_, err = c.CoordinationV1().Leases(namespace).Create(ctx, l, metav1.CreateOptions{DryRun: dry})
				return err
			}
			if err != nil {
				return err
			}
			change(l)
			_, err = c.CoordinationV1().Leases(namespace).Update(ctx, l, metav1.UpdateOptions{DryRun: dry})
			return err
		}
	}
	hold := func(node string) func(*coordinationv1.Lease) {
		return func(l *coordinationv1.Lease) {
			now, d := metav1.NewMicroTime(time.Now()), int32(3)
			l.Spec.HolderIdentity, l.Spec.RenewTime, l.Spec.LeaseDurationSeconds = &node, &now, &d
		}
	}
	annotate := func(k, v string) func(*coordinationv1.Lease) {
		return func(l *coordinationv1.Lease) {
			if l.Annotations == nil {
				l.Annotations = map[string]string{}
			}
			l.Annotations[k] = v
		}
	}
	both := func(fs ...func(*coordinationv1.Lease)) func(*coordinationv1.Lease) {
		return func(l *coordinationv1.Lease) {
			for _, f := range fs {
				f(l)
			}
		}
	}
	const stepAside = `{"%s":{"reason":"WireGuardDegraded","at":"2030-01-01T00:00:00Z"}}`

	type step struct {
		name  string
		agent string // n-a, n-b or unbound
		do    func(kubernetes.Interface, []string) error
		// denied: the policy refuses it (its message holds this); "" = allowed.
		denied string
	}
	steps := []step{
		{"n-a publishes its Kilo annotations", "n-a", merge("n-a", `{"metadata":{"annotations":{"kilo.squat.ai/key":"a-key","kilo.squat.ai/endpoint":"192.0.2.1:51820","meshlet.io/version":"v1"}}}`), ""},
		{"n-a marks itself leader", "n-a", merge("n-a", `{"metadata":{"annotations":{"kilo.squat.ai/leader":"meshlet.io/lease"}}}`), ""},
		{"n-a removes meshlet's leader mark from n-b (a new holder's unmark)", "n-a", unmark("n-b"), ""},
		{"n-a patches n-b's key (interception)", "n-a", merge("n-b", `{"metadata":{"annotations":{"kilo.squat.ai/key":"evil"}}}`), "may only remove meshlet's leader mark from Node n-b"},
		{"n-a patches n-b's endpoint", "n-a", merge("n-b", `{"metadata":{"annotations":{"kilo.squat.ai/endpoint":"203.0.113.9:51820"}}}`), "may only remove meshlet's leader mark"},
		{"n-a removes a user's leader annotation from n-c", "n-a", merge("n-c", `{"metadata":{"annotations":{"kilo.squat.ai/leader":null}}}`), "may only remove meshlet's leader mark"},
		{"n-a changes its own labels", "n-a", merge("n-a", `{"metadata":{"labels":{"topology.kubernetes.io/region":"y"}}}`), "no Node's labels, spec"},
		{"n-a changes its own spec", "n-a", merge("n-a", `{"spec":{"unschedulable":true}}`), "no Node's labels, spec"},
		{"n-a writes another annotation of its own Node", "n-a", merge("n-a", `{"metadata":{"annotations":{"example.com/x":"y"}}}`), "not example.com/x"},
		{"a token naming no node patches n-a", "unbound", merge("n-a", `{"metadata":{"annotations":{"kilo.squat.ai/key":"x"}}}`), "this credential names none"},

		{"n-a takes location x's Lease", "n-a", lease("meshlet-leader-x", hold("n-a")), ""},
		{"n-a renews it", "n-a", lease("meshlet-leader-x", hold("n-a")), ""},
		{"n-a sets its holder to n-b", "n-a", lease("meshlet-leader-x", hold("n-b")), "not n-b where it was n-a"},
		{"n-b renews it for n-a (not the holder)", "n-b", lease("meshlet-leader-x", hold("n-a")), "not n-a where it was n-a"},
		{"n-b adds a step-aside of n-a's", "n-b", lease("meshlet-leader-x", both(hold("n-b"), annotate("meshlet.io/step-asides", fmt.Sprintf(stepAside, "n-a")))), "may add only its own entry"},
		{"n-a records its step-aside and releases", "n-a", lease("meshlet-leader-x", both(hold(""), annotate("meshlet.io/released", "n-a (WireGuardDegraded)"),
			annotate("meshlet.io/step-asides", fmt.Sprintf(stepAside, "n-a")))), ""},
		{"n-a labels it", "n-a", lease("meshlet-leader-x", both(hold("n-a"), func(l *coordinationv1.Lease) { l.Labels["x"] = "y" })), "no label"},
		{"n-b takes the released Lease, keeping n-a's step-aside", "n-b", lease("meshlet-leader-x", hold("n-b")), ""},
		{"n-a takes it from n-b (a holder presumed dead; the location's agents judge it: failover.ForeignHolder)", "n-a", lease("meshlet-leader-x", hold("n-a")), ""},
		{"n-a creates a Lease held by n-b", "n-a", lease("meshlet-leader-y", hold("n-b")), "not n-b where it was none"},
		{"n-a takes the old ClusterMesh status Lease (no longer meshlet's: the plan names the writer)", "n-a", lease("meshlet-clustermesh-status", hold("n-a")), "only meshlet's Leases"},
		{"n-a writes kube-controller-manager's Lease", "n-a", lease("kube-controller-manager", hold("n-a")), "only meshlet's Leases"},
		{"n-a creates a Lease of another name", "n-a", lease("kube-scheduler", hold("n-a")), "only meshlet's Leases"},
		{"n-a creates a location's Lease with another annotation", "n-a", lease("meshlet-leader-w", both(hold("n-a"), annotate("example.com/x", "y"))),
			"only meshlet.io/ annotations"},
		{"a token naming no node takes a location's Lease", "unbound", lease("meshlet-leader-z", hold("n-a")), "this credential names none"},
	}
	isPolicy := func(err error) bool {
		return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '") && strings.Contains(err.Error(), "denied request")
	}
	// The policy takes effect through the API server's informers: wait
	// until a request it denies is denied (dry-run: nothing is written).
	deadline := time.Now().Add(30 * time.Second)
	for probe := merge("n-b", `{"metadata":{"annotations":{"kilo.squat.ai/key":"evil"}}}`); ; {
		err := probe(agents["n-a"], []string{metav1.DryRunAll})
		if isPolicy(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the policy never denied n-a patching n-b: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
	denied := 0
	for _, s := range steps {
		err := s.do(agents[s.agent], nil)
		if s.denied != "" {
			denied++
		}
		switch {
		case s.denied == "" && err != nil:
			t.Errorf("%s: %v, want it allowed", s.name, err)
		case s.denied != "" && (!isPolicy(err) || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), s.denied)):
			t.Errorf("%s: %v, want the policy's denial saying %q", s.name, err, s.denied)
		case s.denied != "":
			t.Logf("denied: %s: %v", s.name, err)
		}
	}

	// Without the policy: RBAC alone lets every denied request through
	// (dry-run, so nothing changes).
	if err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, binding, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for probe := merge("n-b", `{"metadata":{"annotations":{"kilo.squat.ai/key":"evil"}}}`); ; {
		err := probe(agents["n-a"], []string{metav1.DryRunAll})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("without the policy's binding n-a still may not patch n-b: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
	allowed := 0
	for _, s := range steps {
		if s.denied == "" {
			continue
		}
		if err := s.do(agents[s.agent], []string{metav1.DryRunAll}); err != nil {
			t.Errorf("without the policy: %s: %v, want RBAC to allow it", s.name, err)
			continue
		}
		allowed++
	}
	t.Logf("RESULT %s/%s: the policy denied %d requests; without its binding RBAC allowed %d of them", namespace, sa, denied, allowed)
}

// podToken is a token of ServiceAccount sa bound to a pod of it on node
// (made if missing, never run: no kubelet here), as kubelet asks for the
// pod's projected token: it names the node.
func podToken(ctx context.Context, t *testing.T, cs kubernetes.Interface, namespace, sa, node string) string {
	t.Helper()
	pod, err := cs.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: sa + "-" + node},
		Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: node, Containers: []corev1.Container{{Name: "agent", Image: "meshlet"}}}},
		metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		pod, err = cs.CoreV1().Pods(namespace).Get(ctx, sa+"-"+node, metav1.GetOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	exp := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &exp, BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}
