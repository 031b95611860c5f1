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
// two-cluster mesh up, print it, get a cross-cluster ping answered, tear
// everything down and exit 0.
func TestDemoOnce(t *testing.T) {
	prereqs(t)
	bin := filepath.Join(t.TempDir(), "demo")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/demo").CombinedOutput(); err != nil {
		t.Fatalf("building the demo: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
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
	for _, want := range []string{"LEADER", "remote", "0% packet loss", "RESULT: the mesh works", "tearing down"} {
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
