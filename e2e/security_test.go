package e2e

import (
	"crypto/tls"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/harness"
)

// Scenario: hostile kubeconfig Secrets (docs/security.md#kubeconfig). A
// ClusterMesh in cluster-a names three remote clusters whose kubeconfigs
// point at a TLS server of the test's and carry an exec plugin that would
// write a marker file, a tokenFile naming a-x1's WireGuard key, and an auth
// provider. The leaders refuse all three (an UnsafeKubeconfig Event on the
// ClusterMesh naming each field, meshlet_rejections_active), nothing runs,
// no request reaches the server, and the mesh keeps working; meshlet
// diagnose refuses them the same way, and runs the exec plugin only when
// told to with --insecure-kubeconfig-exec (the control: the marker can
// appear).
func TestHostileKubeconfig(t *testing.T) {
	env, ctx := newEnv(t)
	must(t, env.Build(ctx, harness.Small(2, "z")))
	a, ax1, bz1 := env.Cluster("cluster-a"), env.Node("a-x1"), env.Node("b-z1")
	_, err := ax1.WaitReachable(ctx, bz1.PodIP, 30*time.Second)
	must(t, err)

	// The server the hostile kubeconfigs name: it records every request.
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" Authorization="+r.Header.Get("Authorization"))
		mu.Unlock()
		http.Error(w, "no", http.StatusForbidden)
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	srv.Listener = ln
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	defer srv.Close()
	must(t, env.ForwardToNodes(ln.Addr().String()))
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))

	dir := t.TempDir()
	marker := filepath.Join(dir, "exec-ran")
	keyFile := filepath.Join(ax1.Dir, "key")
	keyBytes, err := os.ReadFile(keyFile)
	must(t, err)
	key := strings.TrimSpace(string(keyBytes))
	kubeconfig := func(user string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Config
current-context: hostile
clusters:
- name: hostile
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: hostile
  user:
%s
contexts:
- name: hostile
  context: {cluster: hostile, user: hostile}
`, srv.URL, ca, user)
	}
	cred := filepath.Join(dir, "cred.json")
	must(t, os.WriteFile(cred, []byte(`{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"from-exec"}}`), 0o600))
	hostile := map[string]struct{ user, field string }{
		"cluster-x": {fmt.Sprintf("    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      args: [\"-c\", \"touch %s; cat %s\"]\n      interactiveMode: Never", marker, cred),
			`users["hostile"].user.exec`},
		"cluster-y": {"    tokenFile: " + keyFile, `users["hostile"].user.tokenFile`},
		"cluster-w": {"    auth-provider:\n      name: oidc\n      config: {idp-issuer-url: " + srv.URL + "}", `users["hostile"].user.auth-provider`},
	}
	entries := []string{fmt.Sprintf(`{"name":"cluster-a","local":true,"allowedNetworks":["%s","%s"]}`, a.PodNet, a.WGSubnet)}
	i := 0
	for name, h := range hostile {
		i++
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-kubeconfig", Namespace: harness.Namespace},
			Data: map[string][]byte{"kubeconfig": []byte(kubeconfig(h.user))}}
		_, err := a.Admin.CoreV1().Secrets(harness.Namespace).Create(ctx, sec, metav1.CreateOptions{})
		must(t, err)
		entries = append(entries, fmt.Sprintf(`{"name":"%s","kubeconfigSecretRef":{"name":"%s-kubeconfig","key":"kubeconfig"},"allowedNetworks":["10.25%d.0.0/16"]}`, name, name, i))
	}
	must(t, a.Apply(ctx, fmt.Sprintf(`{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"ClusterMesh",
"metadata":{"name":"zz-hostile","namespace":"%s"},"spec":{"clusters":[%s]}}`, harness.Namespace, strings.Join(entries, ","))))

	// One Event per hostile entry, on the ClusterMesh, naming the field.
	start := time.Now()
	missing := func(evs []corev1.Event) []string {
		var out []string
		for name, h := range hostile {
			found := false
			for _, e := range evs {
				if e.InvolvedObject.Kind == "ClusterMesh" && e.InvolvedObject.Name == "zz-hostile" &&
					e.Reason == string(topology.ReasonUnsafeKubeconfig) && strings.Contains(e.Message, h.field) && strings.Contains(e.Message, name) {
					found = true
				}
			}
			if !found {
				out = append(out, name+" "+h.field)
			}
		}
		return out
	}
	var evs []corev1.Event
	err = harness.Poll(ctx, 30*time.Second, 200*time.Millisecond, "an UnsafeKubeconfig Event per hostile Secret", func() (bool, error) {
		l, err := a.Admin.CoreV1().Events(harness.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		evs = l.Items
		return len(missing(evs)) == 0, nil
	})
	if err != nil {
		t.Fatalf("%v: missing %v", err, missing(evs))
	}
	t.Logf("RESULT hostile kubeconfig: 3 UnsafeKubeconfig Events on the ClusterMesh %.1fs after it was applied", time.Since(start).Seconds())
	for _, e := range evs {
		if e.Reason == string(topology.ReasonUnsafeKubeconfig) {
			t.Logf("OUTPUT Event %s: %s", e.Reason, e.Message)
		}
	}
	// The gauge of rejections in force, on the node that reports them.
	must(t, harness.Poll(ctx, 10*time.Second, 200*time.Millisecond, "meshlet_rejections_active{reason=UnsafeKubeconfig} = 3", func() (bool, error) {
		for _, n := range []*harness.Node{ax1, env.Node("a-x2")} {
			m, err := n.Metrics(ctx)
			if err != nil {
				return false, err
			}
			if v, _ := m.Value("meshlet_rejections_active", "reason", string(topology.ReasonUnsafeKubeconfig), "kind", "ClusterMesh"); v == 3 {
				return true, nil
			}
		}
		return false, nil
	}))

	// meshlet diagnose refuses them the same way (exit status 1, each field
	// named), and runs nothing.
	meshlet := os.Getenv("MESHLET_BIN")
	diagnose := func(extra ...string) (string, int) {
		args := append([]string{"diagnose", "--kubeconfig", a.AdminKubeconfig(), "--namespace", harness.Namespace,
			"--cluster-name", a.Name, "--subnet", a.WGSubnet.String(), "--agents=false"}, extra...)
		out, err := exec.CommandContext(ctx, meshlet, args...).CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), ee.ExitCode()
		}
		must(t, err)
		return string(out), 0
	}
	out, code := diagnose()
	t.Logf("OUTPUT meshlet diagnose (hostile kubeconfigs):\n%s", out)
	if code != 1 || !strings.Contains(out, "docs/security.md#kubeconfig") {
		t.Errorf("diagnose exit status %d, want 1 with the fix's link", code)
	}
	for name, h := range hostile {
		if !strings.Contains(out, "cluster "+name+": ") || !strings.Contains(out, h.field) {
			t.Errorf("diagnose does not name %s's %s", name, h.field)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("an exec plugin ran without --insecure-kubeconfig-exec")
	}
	mu.Lock()
	if len(seen) > 0 {
		t.Errorf("the hostile server was contacted: %v", seen)
	}
	mu.Unlock()

	// /status is not on the network: from another node on the underlay
	// (and from the node itself) the listener serves metrics, not status;
	// meshlet status reads the socket.
	ax2 := env.Node("a-x2")
	must(t, ax1.Stop(syscall.SIGTERM))
	ax1.ExtraArgs = append(ax1.ExtraArgs, "--listen=:1107") // every address, as in the DaemonSet
	must(t, ax1.Start(ctx))
	for _, path := range []string{"/status", "/metrics"} {
		url := fmt.Sprintf("http://%s:1107%s", ax1.IP.Addr(), path)
		code, body, err := ax2.HTTPGet(ctx, url)
		must(t, err)
		if path == "/status" && (code != http.StatusNotFound || strings.Contains(string(body), "publicKey")) {
			t.Errorf("GET %s from a-x2: %d, want 404", url, code)
		}
		if path == "/metrics" && code != http.StatusOK {
			t.Errorf("GET %s from a-x2: %d, want 200 (metrics stay open, as kg's)", url, code)
		}
		t.Logf("RESULT GET %s from another node: %d", url, code)
	}
	if out, err := ax1.Exec(ctx, meshlet, "status", "-o", "json"); err != nil || !strings.Contains(out, `"role": "leader"`) && !strings.Contains(out, `"role": "non-leader"`) {
		t.Errorf("meshlet status on a-x1 (socket): %v\n%s", err, out)
	}

	// The rest of the mesh works: cluster-b still reached, its peers intact.
	_, err = ax1.WaitReachable(ctx, bz1.PodIP, 10*time.Second)
	must(t, err)
	_, err = env.Node("a-x2").WaitReachable(ctx, bz1.PodIP, 10*time.Second)
	must(t, err)

	// The control: with the opt-in, diagnose runs the exec plugin (so the
	// marker check above can fail), and still refuses the path and the
	// auth provider.
	out, _ = diagnose("--insecure-kubeconfig-exec")
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("with --insecure-kubeconfig-exec the exec plugin did not run (%v):\n%s", err, out)
	}
	if !strings.Contains(out, hostile["cluster-y"].field) || !strings.Contains(out, hostile["cluster-w"].field) {
		t.Errorf("with --insecure-kubeconfig-exec, the path and auth provider must still be refused:\n%s", out)
	}
	mu.Lock()
	for _, s := range seen {
		if strings.Contains(s, key) {
			t.Errorf("a request carried a-x1's private key: %s", s)
		}
	}
	t.Logf("RESULT hostile kubeconfig: no marker, no request to the hostile server from the agents or diagnose; with --insecure-kubeconfig-exec diagnose ran the plugin (%d requests, none with a key)", len(seen))
	mu.Unlock()
}
