package runner_test

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/config"
	"github.com/meshlet/meshlet/agent/runtime/grants"
	"github.com/meshlet/meshlet/agent/runtime/runner"
	"github.com/meshlet/meshlet/agent/runtime/status"
	"github.com/meshlet/meshlet/e2e/apiserver"
)

// TestEachGrantFeedsAFeature removes each rule of the shipped RBAC
// (manifests/base/rbac.yaml, with the kubeconfig Secret a ClusterMesh names
// granted by name as manifests/components/remote-secrets does: the base
// grants no Secret) in turn and runs the agent under what is left: without a rule of kg's ClusterRole it refuses to start, naming the
// grant; without any other it meshes with the feature that rule feeds
// turned off (meshlet status says which and what it lacks), and — whatever
// is missing — the API server refuses none of its requests: it asks
// first. The table is the documentation's (docs/security.md#least-privilege).
func TestEachGrantFeedsAFeature(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, admin := grantsCluster(t, "cluster-b-kubeconfig")
	cr, role := shippedRoles(t)
	role.Rules = append(role.Rules, shippedSecretsRule(t))
	updateRole(t, admin, nil, role)
	sa := srv.ServiceAccountConfig(ctx, "kilo-system", "meshlet")
	sa.UserAgent = "meshlet/test"
	if err := apiserver.WaitAuthorized(ctx, sa, apiserver.AgentGrants("kilo-system")...); err != nil {
		t.Fatal(err)
	}

	// What each rule feeds: the feature turned off without it ("" = the
	// agent does not start), or, for Secrets, the remote cluster.
	feeds := map[string]string{
		"nodes": "", "peers": "",
		"events":               grants.Events,
		"clustermeshes":        grants.ClusterMesh,
		"clustermeshes/status": grants.ClusterMeshStatus,
		// Without it the status writer writes the fields every ClusterMesh
		// CRD has.
		"customresourcedefinitions": grants.ClusterMeshStatusSchema,
		"leases":                    grants.LeaderElection,
		"secrets":                   "remote clusters",
	}
	type target struct {
		name  string
		rules *[]rbacv1.PolicyRule
		apply func()
	}
	targets := []target{
		{"ClusterRole", &cr.Rules, func() { updateRole(t, admin, cr, nil) }},
		{"Role", &role.Rules, func() { updateRole(t, admin, nil, role) }},
	}
	for _, tg := range targets {
		all := append([]rbacv1.PolicyRule(nil), *tg.rules...)
		for i, r := range all {
			res := r.Resources[0]
			want, known := feeds[res]
			if !known {
				t.Errorf("%s rule %v: no feature recorded for it in this test's table", tg.name, r.Resources)
				continue
			}
			t.Run(tg.name+" without "+res, func(t *testing.T) {
				*tg.rules = append(append([]rbacv1.PolicyRule(nil), all[:i]...), all[i+1:]...)
				tg.apply()
				defer func() { *tg.rules = all; tg.apply(); waitAllowed(t, ctx, sa, r) }()
				waitDenied(t, ctx, sa, r)
				from := time.Now()
				out := runAgentBriefly(t, ctx, sa, want == "" || res == "secrets")
				switch {
				case want == "":
					if out.err == nil || !strings.Contains(out.err.Error(), res) {
						t.Errorf("the agent started without the %s grant (err %v), want a refusal naming it", res, out.err)
					}
				case res == "secrets":
					// What manifests/base alone gives: the remote cluster
					// off, saying which grant to add.
					if len(out.status.Remotes) != 1 || !strings.Contains(out.status.Remotes[0].Error,
						"may not read Secret kilo-system/cluster-b-kubeconfig: grant list and watch on secrets (resourceNames: [cluster-b-kubeconfig]) in kilo-system") {
						t.Errorf("remote clusters: %+v, want cluster-b's Secret reported unreadable, naming the grant", out.status.Remotes)
					}
				default:
					off := false
					for _, f := range out.status.FeaturesOff {
						off = off || f.Name == want
					}
					if !off || out.err != nil {
						t.Errorf("feature %s not reported off (features off %+v, err %v)", want, out.status.FeaturesOff, out.err)
					}
					if !out.ready {
						t.Errorf("the agent did not mesh without the %s grant", res)
					}
				}
				refused, err := srv.Forbidden(apiserver.ByMeshlet)
				if err != nil {
					t.Fatal(err)
				}
				for _, line := range refused {
					if at, err := time.Parse(time.RFC3339Nano, strings.Fields(line)[0]); err == nil && at.After(from) {
						t.Errorf("refused: %s", line)
					}
				}
				t.Logf("RESULT without the %s %s rule: %s", tg.name, res, describe(want, out))
			})
		}
	}
}

// TestSecretsByName: the Secrets rule manifests/components/remote-secrets
// adds (resourceNames, as the chart renders remoteSecrets and the
// clusterMesh's names) is enough: the agent watches that Secret by name,
// never someone else's in the same namespace, and no request is refused.
func TestSecretsByName(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver")
	}
	ctx := context.Background()
	srv, admin := grantsCluster(t, "cluster-b-kubeconfig", "someone-elses")
	_, role := shippedRoles(t)
	for _, r := range role.Rules {
		if r.Resources[0] == "secrets" {
			t.Fatalf("manifests/base/rbac.yaml grants Secrets: %+v", r)
		}
	}
	role.Rules = append(role.Rules, shippedSecretsRule(t))
	updateRole(t, admin, nil, role)
	sa := srv.ServiceAccountConfig(ctx, "kilo-system", "meshlet")
	sa.UserAgent = "meshlet/test"
	waitDenied(t, ctx, sa, rbacv1.PolicyRule{Verbs: []string{"list"}, APIGroups: []string{""}, Resources: []string{"secrets"}})
	out := runAgentBriefly(t, ctx, sa, true)
	if out.err != nil || len(out.status.Remotes) != 1 || strings.Contains(out.status.Remotes[0].Error, "may not read") {
		t.Fatalf("err %v, remotes %+v: want cluster-b's Secret read", out.err, out.status.Remotes)
	}
	refused, err := srv.Forbidden(apiserver.ByMeshlet)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range refused {
		t.Errorf("refused: %s", line)
	}
	t.Logf("RESULT a Role with resourceNames [cluster-b-kubeconfig]: Secret watched by name (remote: %s), no request refused", out.status.Remotes[0].Error)
}

// grantsCluster starts an API server with meshlet's CRDs and shipped RBAC,
// a node a-1, kubeconfig Secrets of the given names and a ClusterMesh
// whose remote cluster-b uses the first: the leader a-1 reads it (its API
// server does not exist: only the local grants matter here).
func grantsCluster(t *testing.T, secrets ...string) (*apiserver.Server, kubernetes.Interface) {
	t.Helper()
	ctx := context.Background()
	srv := apiserver.Start(t, apiserver.Options{})
	applyFiles(t, srv.AdminConfig(), "manifests/namespace/namespace.yaml", "manifests/crds/peers.kilo.squat.ai.yaml",
		"manifests/crds/clustermeshes.kilo.squat.ai.yaml", "manifests/base/rbac.yaml")
	admin := kubernetes.NewForConfigOrDie(srv.AdminConfig())
	if _, err := admin.CoreV1().Nodes().Create(ctx, node("a-1", "x", "192.168.1.1/24", "10.244.1.0/24", key(1), nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	remoteKC := srv.TokenConfig("nobody")
	remoteKC.Host = "https://127.0.0.1:1"
	for _, name := range secrets {
		if _, err := admin.CoreV1().Secrets("kilo-system").Create(ctx, kubeconfigSecret(t, remoteKC, name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	applyBytes(t, srv, `apiVersion: kilo.squat.ai/v1alpha1
kind: ClusterMesh
metadata: {name: prod, namespace: kilo-system}
spec:
  clusters:
  - {name: cluster-a, local: true, allowedNetworks: [10.244.0.0/16, 10.4.0.0/24]}
  - {name: cluster-b, kubeconfigSecretRef: {name: `+secrets[0]+`}, allowedNetworks: [10.2.0.0/16]}
`)
	return srv, admin
}

type briefRun struct {
	err    error
	ready  bool
	status status.Status
}

// runAgentBriefly runs the agent until its loop is ready (or it fails to
// start), and a little longer when the Secret's fate is to be seen.
func runAgentBriefly(t *testing.T, ctx context.Context, cfg *rest.Config, waitRemote bool) briefRun {
	t.Helper()
	a, err := tryAgent(t, cfg)
	if err != nil {
		return briefRun{err: err}
	}
	return runBriefly(t, ctx, a, waitRemote)
}

// runBriefly runs a until its loop is ready (and, with waitRemote, until
// its remote cluster says why it is not connected), then stops it.
func runBriefly(t *testing.T, ctx context.Context, a *runner.Agent, waitRemote bool) briefRun {
	t.Helper()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(rctx) }()
	defer func() { cancel(); <-done }()
	var out briefRun
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		out.ready = a.Loop.Ready()
		out.status = a.Status(ctx)
		if out.ready && (!waitRemote || (len(out.status.Remotes) > 0 && out.status.Remotes[0].Error != "" && out.status.Remotes[0].Error != "kubeconfig Secret not read yet")) {
			break
		}
		waitTick()
	}
	return out
}

// tryAgent assembles an agent for node a-1 of grantsCluster with a fake
// data plane.
func tryAgent(t *testing.T, cfg *rest.Config) (*runner.Agent, error) {
	t.Helper()
	return tryAgentIn(t, cfg, "kilo-system")
}

// tryAgentIn is tryAgent with the agent's namespace (its Leases and
// ClusterMeshes).
func tryAgentIn(t *testing.T, cfg *rest.Config, namespace string) (*runner.Agent, error) {
	t.Helper()
	var c config.Config
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	c.RegisterTopology(fs)
	c.RegisterAgent(fs)
	c.Namespace, c.Local, c.TopologyLabel = namespace, true, "topology.kubernetes.io/region"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return runner.New(runner.Options{Config: c, Node: "a-1", RestConfig: cfg, WireGuard: newFakeWG(), Host: fakeHost{},
		Self: fakeSelf{topology.Self{PublicKey: key(1), DefaultInterface: "eth0", Version: "v1",
			Addresses: []topology.HostAddress{{Interface: "eth0", Prefix: netip.MustParsePrefix("192.168.1.1/24")}}}},
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
}

func newAgent(t *testing.T, cfg *rest.Config) *runner.Agent {
	t.Helper()
	a, err := tryAgent(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func describe(want string, out briefRun) string {
	switch {
	case want == "":
		return "the agent does not start: " + out.err.Error()
	case want == "remote clusters":
		return "cluster-b not watched: " + out.status.Remotes[0].Error
	}
	for _, f := range out.status.FeaturesOff {
		if f.Name == want {
			return "meshes, feature " + want + " off (lacks " + strings.Join(f.Missing, "; ") + ")"
		}
	}
	return "?"
}

// shippedRoles reads the ClusterRole and Role of manifests/base/rbac.yaml.
func shippedRoles(t *testing.T) (*rbacv1.ClusterRole, *rbacv1.Role) {
	t.Helper()
	f, err := os.Open(repoFile(t, "manifests/base/rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
	var cr *rbacv1.ClusterRole
	var role *rbacv1.Role
	for {
		var obj struct {
			metav1.TypeMeta   `json:",inline"`
			metav1.ObjectMeta `json:"metadata"`
			Rules             []rbacv1.PolicyRule `json:"rules"`
		}
		if err := dec.Decode(&obj); err != nil {
			break
		}
		switch obj.Kind {
		case "ClusterRole":
			cr = &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: obj.Name}, Rules: obj.Rules}
		case "Role":
			role = &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: obj.Name, Namespace: obj.Namespace}, Rules: obj.Rules}
		}
	}
	if cr == nil || role == nil {
		t.Fatal("manifests/base/rbac.yaml: no ClusterRole or Role")
	}
	return cr, role
}

// shippedSecretsRule is the rule manifests/components/remote-secrets adds to
// the Role: the kubeconfig Secret cluster-b-kubeconfig, by name.
func shippedSecretsRule(t *testing.T) rbacv1.PolicyRule {
	t.Helper()
	b, err := os.ReadFile(repoFile(t, "manifests/components/remote-secrets/kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var comp struct {
		Patches []struct {
			Patch string `json:"patch"`
		} `json:"patches"`
	}
	if err := yaml.Unmarshal(b, &comp); err != nil || len(comp.Patches) != 1 {
		t.Fatalf("manifests/components/remote-secrets: %v, %d patches", err, len(comp.Patches))
	}
	var ops []struct {
		Op    string            `json:"op"`
		Path  string            `json:"path"`
		Value rbacv1.PolicyRule `json:"value"`
	}
	if err := yaml.Unmarshal([]byte(comp.Patches[0].Patch), &ops); err != nil || len(ops) != 1 || ops[0].Path != "/rules/-" {
		t.Fatalf("manifests/components/remote-secrets: patch %v, %+v", err, ops)
	}
	r := ops[0].Value
	if len(r.Resources) != 1 || r.Resources[0] != "secrets" || len(r.ResourceNames) == 0 {
		t.Fatalf("manifests/components/remote-secrets adds %+v, want Secrets by name", r)
	}
	return r
}

// grantSecrets grants meshlet's agent on srv the kubeconfig Secrets of
// kilo-system called names, as manifests/components/remote-secrets does
// (manifests/base grants none), and waits until the RBAC authorizer sees it.
func grantSecrets(t *testing.T, srv *apiserver.Server, names ...string) {
	t.Helper()
	ctx := context.Background()
	_, role := shippedRoles(t)
	r := shippedSecretsRule(t)
	r.ResourceNames = names
	role.Rules = append(role.Rules, r)
	updateRole(t, kubernetes.NewForConfigOrDie(srv.AdminConfig()), nil, role)
	var checks []authorizationv1.ResourceAttributes
	for _, n := range names {
		checks = append(checks, authorizationv1.ResourceAttributes{Verb: "watch", Resource: "secrets", Namespace: "kilo-system", Name: n})
	}
	if err := apiserver.WaitAuthorized(ctx, srv.ServiceAccountConfig(ctx, "kilo-system", "meshlet"), checks...); err != nil {
		t.Fatal(err)
	}
}

func updateRole(t *testing.T, cs kubernetes.Interface, cr *rbacv1.ClusterRole, role *rbacv1.Role) {
	t.Helper()
	ctx := context.Background()
	var err error
	if cr != nil {
		var cur *rbacv1.ClusterRole
		if cur, err = cs.RbacV1().ClusterRoles().Get(ctx, cr.Name, metav1.GetOptions{}); err == nil {
			cur.Rules = cr.Rules
			_, err = cs.RbacV1().ClusterRoles().Update(ctx, cur, metav1.UpdateOptions{})
		}
	} else {
		var cur *rbacv1.Role
		if cur, err = cs.RbacV1().Roles(role.Namespace).Get(ctx, role.Name, metav1.GetOptions{}); err == nil {
			cur.Rules = role.Rules
			_, err = cs.RbacV1().Roles(role.Namespace).Update(ctx, cur, metav1.UpdateOptions{})
		}
	}
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

// access is the SelfSubjectAccessReview of a rule's first verb and
// resource (and first name, for a rule that lists names), as cfg's user.
func access(t *testing.T, ctx context.Context, cfg *rest.Config, r rbacv1.PolicyRule) bool {
	t.Helper()
	res, sub, _ := strings.Cut(r.Resources[0], "/")
	ns := ""
	switch res {
	case "clustermeshes", "leases", "secrets":
		ns = "kilo-system"
	case "events":
		ns = "default"
	}
	name := ""
	if len(r.ResourceNames) > 0 {
		name = r.ResourceNames[0]
	}
	rev, err := kubernetes.NewForConfigOrDie(cfg).AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: r.Verbs[0], Group: r.APIGroups[0], Resource: res, Subresource: sub, Namespace: ns, Name: name}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return rev.Status.Allowed
}

// waitDenied and waitAllowed wait until the RBAC authorizer has seen a
// rule removed or restored (it follows Roles through an informer).
func waitDenied(t *testing.T, ctx context.Context, cfg *rest.Config, r rbacv1.PolicyRule) {
	t.Helper()
	waitAccess(t, ctx, cfg, r, false)
}

func waitAllowed(t *testing.T, ctx context.Context, cfg *rest.Config, r rbacv1.PolicyRule) {
	t.Helper()
	waitAccess(t, ctx, cfg, r, true)
}

func waitAccess(t *testing.T, ctx context.Context, cfg *rest.Config, r rbacv1.PolicyRule, want bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for access(t, ctx, cfg, r) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%v on %v: allowed never became %v", r.Verbs, r.Resources, want)
		}
		waitTick()
	}
}

func applyBytes(t *testing.T, srv *apiserver.Server, doc string) {
	t.Helper()
	if _, err := apiserver.Apply(context.Background(), srv.AdminConfig(), []byte(doc), apiserver.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestKgRBACMeshesAndTheAddOnTurnsFeaturesOn: under exactly the RBAC
// Kilo's manifests give kg, in kube-system, the agent meshes with Kilo's
// rule and reports every other feature off with the grant it lacks; with
// manifests/dropin applied beside it, they are all on. Neither way does it
// make a request the API server refuses.
func TestKgRBACMeshesAndTheAddOnTurnsFeaturesOn(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver")
	}
	ctx := context.Background()
	srv := apiserver.Start(t, apiserver.Options{})
	applyFiles(t, srv.AdminConfig(), "manifests/crds/peers.kilo.squat.ai.yaml", "manifests/crds/clustermeshes.kilo.squat.ai.yaml")
	applyFiles(t, srv.AdminConfig(), "agent/runtime/runner/testdata/kilo-rbac.yaml")
	admin := kubernetes.NewForConfigOrDie(srv.AdminConfig())
	if _, err := admin.CoreV1().Nodes().Create(ctx, node("a-1", "x", "192.168.1.1/24", "10.244.1.0/24", key(1), nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sa := srv.ServiceAccountConfig(ctx, "kube-system", "kilo")
	sa.UserAgent = "meshlet/test"
	waitAllowed(t, ctx, sa, rbacv1.PolicyRule{Verbs: []string{"watch"}, APIGroups: []string{""}, Resources: []string{"nodes"}})
	run := func() briefRun {
		a, err := tryAgentIn(t, sa, "kube-system")
		if err != nil {
			t.Fatal(err)
		}
		return runBriefly(t, ctx, a, false)
	}
	out := run()
	if !out.ready {
		t.Fatalf("the agent did not mesh under kg's RBAC: %+v", out.status.LastRun)
	}
	off := map[string]bool{}
	for _, f := range out.status.FeaturesOff {
		off[f.Name] = true
	}
	for _, f := range []string{grants.LeaderElection, grants.Events, grants.ClusterMesh, grants.ClusterMeshStatus, grants.Lifecycle} {
		if !off[f] {
			t.Errorf("feature %s on under kg's RBAC", f)
		}
	}
	t.Logf("RESULT kg's RBAC: meshes (ready), features off: %v", out.status.FeaturesOff)
	if _, err := apiserver.ApplyFile(ctx, srv.AdminConfig(), repoFile(t, "manifests/dropin/grants/grants.yaml"), apiserver.ApplyOptions{Namespace: "kube-system"}); err != nil {
		t.Fatal(err)
	}
	if err := apiserver.WaitAuthorized(ctx, sa, authorizationv1.ResourceAttributes{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "kube-system"},
		authorizationv1.ResourceAttributes{Verb: "get", Group: "apps", Resource: "daemonsets", Namespace: "kube-system"}); err != nil {
		t.Fatal(err)
	}
	if out = run(); !out.ready || len(out.status.FeaturesOff) != 0 {
		t.Errorf("with manifests/dropin: ready %v, features off %+v", out.ready, out.status.FeaturesOff)
	}
	refused, err := srv.Forbidden(apiserver.ByMeshlet)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range refused {
		t.Errorf("refused: %s", r)
	}
}
