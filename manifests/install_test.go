package manifests_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/meshlet/meshlet/e2e/apiserver"
)

// kiloPeerCRD is Kilo's Peer CRD as Helm installed it on Cozystack: owned
// by the field manager "helm", with Helm's release metadata, and a schema
// that is not meshlet's copy byte for byte (a description differs).
func kiloPeerCRD(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile("crds/peers.kilo.squat.ai.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd unstructured.Unstructured
	if err := yaml.Unmarshal(b, &crd.Object); err != nil {
		t.Fatal(err)
	}
	crd.SetLabels(map[string]string{"app.kubernetes.io/managed-by": "Helm"})
	crd.SetAnnotations(map[string]string{"meta.helm.sh/release-name": "kilo", "meta.helm.sh/release-namespace": "cozy-kilo"})
	vs, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	v0 := vs[0].(map[string]any)
	_ = unstructured.SetNestedField(v0, "Peer as Kilo's chart ships it.", "schema", "openAPIV3Schema", "description")
	_ = unstructured.SetNestedSlice(crd.Object, vs, "spec", "versions")
	return &crd
}

// TestInstallKeepsKiloObjects installs meshlet as manifests/README.md says, with
// kubectl and helm, on an API server that enforces Pod Security baseline
// (Talos) and already holds Kilo's Helm-owned Peer CRD, a Peer, and a
// kilo-system namespace with someone else's Secret (Cozystack with
// kilo-clustermesh-operator); then uninstalls both ways. Kilo's objects must
// come out of all of it untouched.
func TestInstallKeepsKiloObjects(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	admissionFile := filepath.Join(dir, "admission.yaml")
	if err := os.WriteFile(admissionFile, []byte(apiserver.PodSecurityBaseline), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := apiserver.Start(t, apiserver.Options{ExtraArgs: []string{"--admission-control-config-file=" + admissionFile}})
	admin := srv.AdminConfig()
	cs := kubernetes.NewForConfigOrDie(admin)
	dyn := dynamic.NewForConfigOrDie(admin)
	kubeconfig := srv.WriteKubeconfig("admin", admin)
	kubectl := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, srv.KubectlPath(), append([]string{"--kubeconfig", kubeconfig}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	mustKubectl := func(args ...string) string {
		t.Helper()
		out, err := kubectl(args...)
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}

	// Kilo's side, before meshlet.
	if _, err := apiserver.ApplyObjects(ctx, admin, []*unstructured.Unstructured{kiloPeerCRD(t)}, apiserver.ApplyOptions{FieldManager: "helm"}); err != nil {
		t.Fatalf("Kilo's CRD: %v", err)
	}
	peer := `{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"laptop"},
		"spec":{"allowedIPs":["10.5.0.1/32"],"publicKey":"GY5aT1N9dTR/nJnT1N2f4ClZWVj0jOAld0r8ysWLyjg=","persistentKeepalive":10}}`
	if _, err := apiserver.Apply(ctx, admin, []byte(peer), apiserver.ApplyOptions{FieldManager: "kubectl-client-side-apply"}); err != nil {
		t.Fatalf("Peer: %v", err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"owner": "kilo-clustermesh-operator"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "cluster-b-kubeconfig"},
		StringData: map[string]string{"kubeconfig": "not used here"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crdBefore, err := dyn.Resource(crdGVR).Get(ctx, "peers.kilo.squat.ai", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kiloUntouched := func(step string) {
		t.Helper()
		crd, err := dyn.Resource(crdGVR).Get(ctx, "peers.kilo.squat.ai", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: Kilo's Peer CRD: %v", step, err)
		}
		if crd.GetResourceVersion() != crdBefore.GetResourceVersion() {
			t.Errorf("%s: Kilo's Peer CRD was written (resourceVersion %s -> %s); managers %v", step,
				crdBefore.GetResourceVersion(), crd.GetResourceVersion(), managers(crd))
		}
		if _, err := dyn.Resource(peersGVR).Get(ctx, "laptop", metav1.GetOptions{}); err != nil {
			t.Errorf("%s: Peer laptop: %v", step, err)
		}
		n, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil || n.DeletionTimestamp != nil || n.Labels["owner"] != "kilo-clustermesh-operator" {
			t.Errorf("%s: namespace %s: %v %+v", step, ns, err, n)
		}
		if _, err := cs.CoreV1().Secrets(ns).Get(ctx, "cluster-b-kubeconfig", metav1.GetOptions{}); err != nil {
			t.Errorf("%s: the operator's Secret: %v", step, err)
		}
	}

	// Talos: the DaemonSet's pod is rejected in a namespace without the
	// label; manifests/namespace labels the existing namespace.
	podOf := func() *corev1.Pod {
		ds := find(decode(t, kustomizeBuild(t, ".")), "DaemonSet", "meshlet")
		spec, _, _ := unstructured.NestedMap(ds.Object, "spec", "template", "spec")
		var pod corev1.Pod
		if err := runtimeFromMap(spec, &pod.Spec); err != nil {
			t.Fatal(err)
		}
		pod.Name = "meshlet-probe"
		pod.Spec.NodeName = "n1"
		return &pod
	}
	_, err = cs.CoreV1().Pods(ns).Create(ctx, podOf(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err == nil || !strings.Contains(err.Error(), "violates PodSecurity") {
		t.Fatalf("meshlet's pod before the namespace label: %v, want a PodSecurity rejection (is baseline enforced?)", err)
	}
	t.Logf("without the label, as on Talos: %v", err)
	mustKubectl("apply", "--server-side", "-k", "namespace")
	mustKubectl("apply", "--server-side", "-k", ".")
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, podOf(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("meshlet's pod after manifests/namespace: %v", err)
	}
	kiloUntouched("kubectl apply -k manifests/namespace, manifests")
	// The default apply needs no Prometheus Operator; the monitoring
	// component does, and fails cleanly without it.
	if out, err := kubectl("apply", "--server-side", "-k", "monitoring"); err == nil {
		t.Errorf("manifests/monitoring applied without the Prometheus Operator CRDs: %s", out)
	}
	// What the optional CRD component would do on Cozystack: conflict
	// with Helm's fields, which is why it is separate.
	if out, err := kubectl("apply", "--server-side", "-k", "crds"); err == nil || !strings.Contains(out, "conflict") {
		t.Errorf("manifests/crds over Helm's CRD: %v %s, want a conflict", err, out)
	} else {
		t.Logf("manifests/crds where Helm owns the CRD (not part of the default): %s", conflictLine(out))
	}
	kiloUntouched("the refused manifests/crds")

	mustKubectl("delete", "-k", ".", "--wait=false")
	waitGone(ctx, t, func() error {
		_, err := cs.AppsV1().DaemonSets(ns).Get(ctx, "meshlet", metav1.GetOptions{})
		return err
	})
	kiloUntouched("kubectl delete -k manifests")

	// Helm, as a Cozystack HelmRelease would: crds/ skipped where they
	// exist, and uninstall leaves them.
	helmRun := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, helmBin(t), append(args, "--kubeconfig", kubeconfig)...)
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(dir, "helm-cache"), "HELM_CONFIG_HOME="+filepath.Join(dir, "helm-config"),
			"HELM_DATA_HOME="+filepath.Join(dir, "helm-data"))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
	}
	helmRun("install", "meshlet", "chart", "--namespace", ns, "--set", "clusterMesh.enabled=true",
		"--set", "clusterMesh.clusters[0].name=a", "--set", "clusterMesh.clusters[0].local=true",
		"--set", "clusterMesh.clusters[0].allowedNetworks={10.1.0.0/16}", "--set", "clusterMesh.clusters[1].name=b",
		"--set", "clusterMesh.clusters[1].persistentKeepalive=25", "--set", "clusterMesh.clusters[1].allowedNetworks={10.2.0.0/16}",
		"--set", "clusterMesh.clusters[1].kubeconfigSecretRef.name=cluster-b-kubeconfig",
		"--set", "clusterMesh.clusters[1].kubeconfigSecretRef.key=kubeconfig")
	if _, err := cs.AppsV1().DaemonSets(ns).Get(ctx, "meshlet", metav1.GetOptions{}); err != nil {
		t.Errorf("after helm install: %v", err)
	}
	if _, err := dyn.Resource(cmGVR).Namespace(ns).Get(ctx, "mesh", metav1.GetOptions{}); err != nil {
		t.Errorf("ClusterMesh of the chart: %v", err)
	}
	kiloUntouched("helm install")
	helmRun("uninstall", "meshlet", "--namespace", ns, "--wait")
	if _, err := cs.RbacV1().ClusterRoles().Get(ctx, "meshlet", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ClusterRole meshlet after helm uninstall: %v", err)
	}
	kiloUntouched("helm uninstall")
	// Helm never deletes CRDs: the ClusterMesh CRD (applied above through
	// manifests/crds, which could add it since nobody owned it) stays.
	if _, err := dyn.Resource(crdGVR).Get(ctx, "clustermeshes.kilo.squat.ai", metav1.GetOptions{}); err != nil {
		t.Errorf("ClusterMesh CRD after helm uninstall: %v", err)
	}
}

func managers(o *unstructured.Unstructured) []string {
	var m []string
	for _, f := range o.GetManagedFields() {
		m = append(m, f.Manager)
	}
	return m
}

func conflictLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, "conflict") {
			return l
		}
	}
	return s
}

func waitGone(ctx context.Context, t *testing.T, get func() error) {
	t.Helper()
	for {
		if err := get(); apierrors.IsNotFound(err) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("object not deleted before the test's deadline")
		case <-time.After(100 * time.Millisecond):
		}
	}
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// runtimeFromMap converts an unstructured map into a typed value.
func runtimeFromMap(m map[string]any, into any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructured(m, into)
}
