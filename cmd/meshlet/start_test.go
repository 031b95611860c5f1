package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// asMeshlet makes the test binary meshlet itself when re-executed with it
// set (TestFailedStartLeavesHostClean runs it in a network namespace; the
// userspace device it spawns is the test binary again).
const asMeshlet = "MESHLET_TEST_AS_MESHLET"

func TestMain(m *testing.M) {
	if os.Getenv(asMeshlet) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// TestFailedStartLeavesHostClean: a start that fails leaves the host as
// it found it — before touching it when the command line or the kubeconfig
// is wrong, and removing the WireGuard device (and its process) it created
// when a later step fails.
func TestFailedStartLeavesHostClean(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("needs root: runs meshlet in a network namespace")
	}
	ns := fmt.Sprintf("mlstart-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	_ = exec.Command("ip", "-n", ns, "link", "set", "lo", "up").Run()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	// A server nothing listens on: the agent starts (it assumes its
	// grants when it cannot ask) and fails at a later step.
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
current-context: c
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	notASocket := filepath.Join(dir, "status.sock")
	if err := os.WriteFile(notASocket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	iface := fmt.Sprintf("mlst%d", os.Getpid()%100000)
	for _, tc := range []struct {
		name, stderr string
		args         []string
	}{
		{"missing kubeconfig", "kubernetes client config", []string{"--kubeconfig=" + filepath.Join(dir, "nonexistent")}},
		{"status socket taken, after the device was created", "is not a socket", []string{"--kubeconfig=" + kubeconfig, "--status-socket=" + notASocket}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"netns", "exec", ns, os.Args[0], "run", "--hostname=n1", "--wireguard=userspace",
				"--interface=" + iface, "--key-file=" + filepath.Join(dir, "key"), "--listen=127.0.0.1:0",
				"--iptables-backend=system"}, tc.args...)
			cmd := exec.Command("ip", args...)
			cmd.Env = append(os.Environ(), asMeshlet+"=1")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
				t.Fatalf("exit: %v, want status 1; stderr:\n%s", err, stderr.String())
			}
			t.Logf("meshlet: %s", stderr.String())
			if !strings.Contains(stderr.String(), tc.stderr) {
				t.Errorf("stderr lacks %q:\n%s", tc.stderr, stderr.String())
			}
			// The spawned device process exits on SIGTERM; its TUN goes with
			// it. Wait for that (bounded), then nothing may be left.
			deadline := time.Now().Add(10 * time.Second)
			for {
				out, err := exec.Command("ip", "-n", ns, "link", "show", iface).CombinedOutput()
				if err != nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s left behind: %s", iface, out)
				}
				time.Sleep(50 * time.Millisecond) // poll interval
			}
			for _, f := range []string{iface + ".sock", iface + ".meshlet.pid"} {
				if _, err := os.Stat(filepath.Join("/var/run/wireguard", f)); err == nil {
					t.Errorf("/var/run/wireguard/%s left behind", f)
				}
			}
		})
	}
}
