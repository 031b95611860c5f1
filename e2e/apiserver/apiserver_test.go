package apiserver_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/meshlet/meshlet/e2e/apiserver"
)

const widgetCRD = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  names: {kind: Widget, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {size: {type: integer}}}
---
apiVersion: example.com/v1
kind: Widget
metadata: {name: w1}
spec: {size: 3}
`

func TestServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver")
	}
	ctx := context.Background()
	srv := apiserver.Start(t, apiserver.Options{
		Users: []apiserver.User{{Name: "alice", Groups: []string{"readers"}}},
	})
	admin := kubernetes.NewForConfigOrDie(srv.AdminConfig())

	// Nodes can be created without a kubelet.
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// RBAC is enforced for token users, and groups come from the token file.
	alice := kubernetes.NewForConfigOrDie(srv.UserConfig("alice"))
	if _, err := alice.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("alice lists nodes before any binding: err=%v, want Forbidden", err)
	}
	mustCreateBinding(t, admin, rbacv1.Subject{Kind: rbacv1.GroupKind, Name: "readers"})
	// The RBAC authorizer reads bindings from an informer cache: poll until
	// the new binding is seen.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := alice.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err == nil {
			break
		}
		if !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			t.Fatalf("alice (group readers) lists nodes: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // poll interval, bounded by deadline
	}

	// Service-account tokens from the TokenRequest API authenticate.
	sa := kubernetes.NewForConfigOrDie(srv.ServiceAccountConfig(ctx, "kilo-system", "probe"))
	if _, err := sa.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("unbound service account gets a node: err=%v, want Forbidden", err)
	}

	// CRDs followed by their objects in one file.
	objs, err := apiserver.Apply(ctx, srv.AdminConfig(), []byte(widgetCRD), apiserver.ApplyOptions{})
	if err != nil || len(objs) != 2 {
		t.Fatalf("apply: %d objects, %v", len(objs), err)
	}
	if _, err := apiserver.Apply(ctx, srv.AdminConfig(), []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: nope}\n"), apiserver.ApplyOptions{DryRun: true}); err == nil {
		t.Fatal("dry-run into a missing namespace succeeded")
	}

	// kubectl with a written kubeconfig.
	kc := srv.WriteKubeconfig("admin", srv.AdminConfig())
	out, err := exec.Command(srv.KubectlPath(), "--kubeconfig", kc, "get", "widgets", "-o", "name").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "widget.example.com/w1" {
		t.Fatalf("kubectl: %v: %s", err, out)
	}

	// Outage: stop, the API is unreachable, start, data survived.
	srv.Stop()
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = admin.CoreV1().Nodes().Get(short, "n1", metav1.GetOptions{})
	cancel()
	if err == nil {
		t.Fatal("API answered while stopped")
	}
	srv.Start()
	if _, err := admin.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); err != nil {
		t.Fatalf("after restart: %v", err)
	}
	if filepath.Dir(kc) != srv.Dir() {
		t.Fatalf("kubeconfig %s not in %s", kc, srv.Dir())
	}
}

func mustCreateBinding(t *testing.T, cs kubernetes.Interface, subj rbacv1.Subject) {
	t.Helper()
	ctx := context.Background()
	_, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "node-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "node-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "node-reader"},
		Subjects:   []rbacv1.Subject{subj},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}
