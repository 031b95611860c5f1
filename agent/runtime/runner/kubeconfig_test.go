package runner_test

// Credentials are never echoed (docs/security.md#kubeconfig): every
// hostile kubeconfig shape of kubeconfigtest.Hostiles, each with its own
// marker token and client key, goes through the agent against real API
// servers, and none of those bytes appears in the Events, the ClusterMesh
// status, /status, the agent's logs (its slog and client-go's klog, all
// it writes to stderr), /metrics, or meshlet diagnose's reading of the
// same Secrets (cluster.ReadRemote).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/agent/runtime/cluster/kubeconfigtest"
	"github.com/meshlet/meshlet/agent/runtime/runner"
	"github.com/meshlet/meshlet/e2e/apiserver"
)

// lockedBuffer is the agent's log, written by many goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// captureStderr sends what the process writes to stderr (client-go's klog
// among it) to w until the test ends.
func captureStderr(t *testing.T, w io.Writer) {
	r, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = pw
	done := make(chan struct{})
	go func() { _, _ = io.Copy(w, r); close(done) }()
	t.Cleanup(func() {
		os.Stderr = saved
		_ = pw.Close()
		<-done
		_ = r.Close()
	})
}

func TestHostileKubeconfigsNeverEchoed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two kube-apiservers")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	local := apiserver.Start(t, apiserver.Options{})
	remote := apiserver.Start(t, apiserver.Options{})
	applyFiles(t, local.AdminConfig(), "manifests/namespace/namespace.yaml", "manifests/crds/peers.kilo.squat.ai.yaml",
		"manifests/crds/clustermeshes.kilo.squat.ai.yaml", "manifests/base/rbac.yaml")
	applyFiles(t, remote.AdminConfig(), "manifests/remote/namespace.yaml", "manifests/crds/peers.kilo.squat.ai.yaml", "manifests/remote/rbac.yaml")
	ladmin := kubernetes.NewForConfigOrDie(local.AdminConfig())
	if _, err := ladmin.CoreV1().Nodes().Create(ctx, node("a-1", "x", "192.168.1.1/24", "10.244.1.0/24", key(1), nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	hs, err := kubeconfigtest.Hostiles(remote.URL(), remote.CAData())
	if err != nil {
		t.Fatal(err)
	}
	// One Secret per shape, one remote cluster each, eight to a
	// ClusterMesh (an object's Events are rate-limited by client-go's
	// recorder: 25 at once, similar ones aggregated after 10).
	clusterOf := map[string]string{} // shape → cluster
	mesh := map[string]string{}      // cluster → ClusterMesh
	var entries []string
	meshes := 0
	flush := func() {
		name := fmt.Sprintf("hostile-%d", meshes)
		meshes++
		doc := fmt.Sprintf(`{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"ClusterMesh","metadata":{"name":%q,"namespace":"kilo-system"},"spec":{"clusters":[`+
			`{"name":"home","local":true,"allowedNetworks":["10.244.0.0/16","10.4.0.0/24"]},%s]}}`, name, strings.Join(entries, ","))
		if _, err := apiserver.Apply(ctx, local.AdminConfig(), []byte(doc), apiserver.ApplyOptions{}); err != nil {
			t.Fatal(err)
		}
		entries = nil
	}
	for i, h := range hs {
		c := fmt.Sprintf("h-%02d", i)
		clusterOf[h.Name] = c
		mesh[c] = fmt.Sprintf("hostile-%d", i/8)
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "kc-" + c, Namespace: "kilo-system"}, Data: map[string][]byte{"kubeconfig": h.Kubeconfig}}
		if _, err := ladmin.CoreV1().Secrets("kilo-system").Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
		entries = append(entries, fmt.Sprintf(`{"name":%q,"kubeconfigSecretRef":{"name":"kc-%s","key":"kubeconfig"},"allowedNetworks":["10.%d.0.0/16"]}`, c, c, 100+i))
		if len(entries) == 8 {
			flush()
		}
	}
	if len(entries) > 0 {
		flush()
	}

	// The agent, logging everything (debug) to what it writes to stderr.
	var logs lockedBuffer
	captureStderr(t, &logs)
	cfg := agentConfig()
	cfg.ClusterMeshStatus = true
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	opts := a1Options(cfg, local.AdminConfig(), newFakeWG(), slog.LevelDebug)
	opts.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	agent, err := runner.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	metricsAddr, err := agent.Serve(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "run", "status.sock")
	if err := agent.ServeStatus(ctx, sock); err != nil {
		t.Fatal(err)
	}

	// Every refused shape: an UnsafeKubeconfig Event on its ClusterMesh
	// naming the cluster and the field, and a message in the ClusterMesh
	// status; every accepted one (the server refuses its credentials): a
	// message there too.
	kiloAdmin, err := cluster.KiloClient(local.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	var evs []corev1.Event
	var cms []clustermesh.ClusterMesh
	missing := func() []string {
		var out []string
		statuses := map[string]string{}
		for _, m := range cms {
			for _, c := range m.Status.Clusters {
				statuses[c.Name] = c.Message
			}
		}
		for _, h := range hs {
			c := clusterOf[h.Name]
			if statuses[c] == "" {
				out = append(out, c+" ("+h.Name+"): no message in its ClusterMesh status")
			}
			if h.Field == "" {
				continue
			}
			found := false
			for _, e := range evs {
				found = found || e.Reason == string(topology.ReasonUnsafeKubeconfig) && e.InvolvedObject.Name == mesh[c] &&
					strings.Contains(e.Message, "cluster "+c+":") && strings.Contains(e.Message, h.Field)
			}
			if !found {
				out = append(out, c+" ("+h.Name+"): no Event naming "+h.Field)
			}
		}
		return out
	}
	refused := 0
	for _, h := range hs {
		if h.Field != "" {
			refused++
		}
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		l, err := ladmin.CoreV1().Events("kilo-system").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		evs = l.Items
		var ml clustermesh.ClusterMeshList
		if err := kiloAdmin.Get().Namespace("kilo-system").Resource("clustermeshes").Do(ctx).Into(&ml); err != nil {
			t.Fatal(err)
		}
		cms = ml.Items
		active := testutil.ToFloat64(agent.Metrics.RejectionsActive.WithLabelValues(string(topology.ReasonUnsafeKubeconfig), "ClusterMesh"))
		m := missing()
		if len(m) == 0 && active == float64(refused) {
			break
		}
		if time.Now().After(deadline) {
			for _, e := range evs {
				t.Logf("Event %s %s/%s: %.300s", e.Reason, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Message)
			}
			for _, m := range cms {
				t.Logf("ClusterMesh %s: %d clusters, conditions %+v", m.Name, len(m.Status.Clusters), m.Status.Conditions)
			}
			// Not fatal: what was written is searched all the same.
			t.Errorf("after 90 s: meshlet_rejections_active{UnsafeKubeconfig} %v, want %d; missing:\n%s", active, refused, strings.Join(m, "\n"))
			break
		}
		waitTick()
	}
	t.Logf("%d shapes: %d refused (one Event each), %d accepted and refused by the API server", len(hs), refused, len(hs)-refused)

	// What each reader sees.
	seen := map[string]string{}
	b, _ := json.Marshal(evs)
	seen["Events"] = string(b)
	b, _ = json.Marshal(cms)
	seen["ClusterMesh status"] = string(b)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	seen["/status"] = get(ctx, t, hc, "http://meshlet/status")
	seen["/metrics"] = get(ctx, t, http.DefaultClient, "http://"+metricsAddr+"/metrics")
	var diagnose []string
	for _, h := range hs {
		rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
		_, err := cluster.ReadRemote(rctx, clock.RealClock{}, h.Kubeconfig, cluster.KubeconfigPolicy{})
		rcancel()
		if err == nil {
			t.Errorf("diagnose: %s read", h.Name)
			continue
		}
		diagnose = append(diagnose, clusterOf[h.Name]+": "+err.Error())
	}
	seen["meshlet diagnose (ReadRemote)"] = strings.Join(diagnose, "\n")
	cancel()
	<-done
	done <- nil // for the cleanup
	seen["logs"] = logs.String()

	for _, where := range []string{"Events", "ClusterMesh status", "/status", "logs", "/metrics", "meshlet diagnose (ReadRemote)"} {
		text := seen[where]
		if leaks := kubeconfigtest.Leaks(hs, text); len(leaks) > 0 {
			t.Errorf("%s (%d bytes) carry credentials: %s", where, len(text), strings.Join(leaks, "; "))
		} else {
			t.Logf("%s: %d bytes, no marker token or key bytes", where, len(text))
		}
	}
	for _, e := range evs {
		if e.Reason == string(topology.ReasonUnsafeKubeconfig) {
			t.Logf("OUTPUT Event %s: %s", e.InvolvedObject.Name, e.Message)
		}
	}
	t.Logf("OUTPUT meshlet diagnose:\n%s", seen["meshlet diagnose (ReadRemote)"])
}

func get(ctx context.Context, t *testing.T, c *http.Client, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b)
}
