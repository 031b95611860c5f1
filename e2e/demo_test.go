package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDemoOnce runs `make demo`'s program with --once: it must bring the
// mesh up (a cluster behind NAT, a laptop as a Kilo Peer), print it with
// each peer's keepalive and why and the Lease holders, get a ping across
// the NAT answered, add a Peer under a running ping without touching any
// other session or losing a ping, run every next step it printed (each must
// succeed: `meshlet diagnose` finds no error on the healthy mesh), tear
// everything down and exit 0.
func TestDemoOnce(t *testing.T) {
	prereqs(t)
	bin := filepath.Join(t.TempDir(), "demo")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/demo").CombinedOutput(); err != nil {
		t.Fatalf("building the demo: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "--once")
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	t.Logf("demo output:\n%s", out.String())
	if err != nil {
		t.Fatalf("demo --once: %v", err)
	}
	for _, want := range []string{
		"behind NAT", "holds Lease meshlet-leader-x", "holds Lease meshlet-leader-n", // NAT, the Lease holders
		"25s (its ClusterMesh entry)", "10s (the Peer's spec)", // keepalive per peer, and why
		"3 of 3 answered", // across the NAT
		"session kept (same handshake, same endpoint)", // the change
		"ok     what the agent on a-x1 does", "ok     the whole of cluster-a", "ok     the mesh as a picture", "ok     a-x1's WireGuard device", "ok     kubectl",
		"RESULT: the mesh works", "torn down",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	report(t, "demo --once: up, printed, pinged and torn down in %v", time.Since(start).Round(time.Second))
	// Nothing left behind: no namespace of the demo's process.
	prefix := fmt.Sprintf("ml%d-", cmd.Process.Pid)
	if ns, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(ns), prefix) {
		t.Errorf("the demo left namespaces behind: %s", ns)
	}
}
