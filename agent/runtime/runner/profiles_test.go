package runner_test

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/runtime/status"
)

// TestStatusSocketServesProfiles: Go's profiles are on the status socket
// (root only), and not on the network listener.
func TestStatusSocketServesProfiles(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver")
	}
	srv, _ := grantsCluster(t, "cluster-b-kubeconfig")
	a := newAgent(t, srv.AdminConfig())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sock := filepath.Join(t.TempDir(), "run", "status.sock")
	if err := a.ServeStatus(ctx, sock); err != nil {
		t.Fatal(err)
	}
	addr, err := a.Serve(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	onSocket := status.SocketClient(sock, 10*time.Second)
	get := func(c *http.Client, url string) (int, string) {
		t.Helper()
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(onSocket, "http://status/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("status socket /debug/pprof/: %d %.200s", code, body)
	}
	if code, body := get(onSocket, "http://status/debug/pprof/profile?seconds=1"); code != http.StatusOK || len(body) == 0 {
		t.Errorf("status socket CPU profile: %d, %d bytes", code, len(body))
	}
	if code, _ := get(http.DefaultClient, "http://"+addr+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("the network listener serves /debug/pprof/: %d", code)
	}
}
