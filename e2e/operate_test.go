package e2e

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/runtime/status"
	"github.com/meshlet/meshlet/e2e/harness"
)

// Scenario 9: the operator's view of a live two-cluster mesh. `meshlet
// status` inside a node reads its running agent; `meshlet diagnose` checks
// the cluster and its remote cluster through the ClusterMesh Secrets and
// fails (exit status 1) when the remote API server is down; `meshlet graph`
// draws the mesh. The outputs are logged for docs/operating.md.
func TestOperate(t *testing.T) {
	env, ctx := newEnv(t)
	must(t, env.Build(ctx, harness.TwoByTwo()))
	a, b := env.Cluster("cluster-a"), env.Cluster("cluster-b")
	ax1, ax2, bz1 := env.Node("a-x1"), env.Node("a-x2"), env.Node("b-z1")
	must(t, env.WaitConverged(ctx, 60*time.Second))
	// Traffic both ways, so traffic-only peers are judged.
	for _, p := range [][2]*harness.Node{{ax1, bz1}, {bz1, ax1}, {ax2, bz1}} {
		_, err := p[0].WaitReachable(ctx, p[1].PodIP, 30*time.Second)
		must(t, err)
	}
	meshlet := os.Getenv("MESHLET_BIN")

	t.Run("status", func(t *testing.T) {
		var st status.Status
		bw1 := env.Node("b-w1")
		must(t, harness.Poll(ctx, 30*time.Second, 200*time.Millisecond, "a-x1's remote peers judged up", func() (bool, error) {
			// Traffic to both of cluster-b's leaders while polling: a peer
			// without keepalive is judged from when traffic was sent to it.
			for _, dst := range []*harness.Node{bz1, bw1} {
				if _, err := ax1.Ping(ctx, dst.PodIP, 1, 100*time.Millisecond, time.Second); err != nil {
					return false, err
				}
			}
			out, err := ax1.Exec(ctx, meshlet, "status", "-o", "json")
			if err != nil {
				return false, err
			}
			st = status.Status{}
			if err := json.Unmarshal([]byte(out), &st); err != nil {
				return false, err
			}
			// No keepalive here: a peer nothing is sent to is idle (not
			// judged); cluster-b's leaders carry the pings.
			for _, p := range st.Peers {
				if p.State != "up" && (p.Kind == "remote" || p.State != "idle") {
					return false, errors.New("peer " + p.Name + " is " + p.State)
				}
			}
			return len(st.Peers) > 0, nil
		}))
		if st.Role != "leader" || st.Device.Type != "userspace" || st.Device.PublicKey == "" || !st.LastRun.Ready || st.LastRun.Error != "" {
			t.Errorf("a-x1 status: role %q, device %+v, last run %+v", st.Role, st.Device, st.LastRun)
		}
		if len(st.Drift) != 0 {
			t.Errorf("a-x1 drift on a converged mesh: %v", st.Drift)
		}
		// No named finding (docs/runbooks.md) on a healthy leader.
		if len(st.Findings) != 0 {
			t.Errorf("a-x1 findings on a healthy mesh: %+v", st.Findings)
		}
		kinds := map[string]int{}
		for _, p := range st.Peers {
			kinds[p.Kind]++
		}
		if kinds["segment"] != 1 || kinds["remote"] != 2 {
			t.Errorf("a-x1 peers by kind %v, want 1 segment (a-y1) and 2 remote (cluster-b's leaders)", kinds)
		}
		if len(st.Remotes) != 1 || !st.Remotes[0].Ready || !st.Remotes[0].Synced || st.Remotes[0].Nodes != 4 {
			t.Errorf("a-x1 remotes: %+v, want cluster-b ready and synced with 4 nodes", st.Remotes)
		}
		text, err := ax1.Exec(ctx, meshlet, "status")
		must(t, err)
		if !strings.Contains(text, "Role: leader with ") || !strings.Contains(text, "No drift") {
			t.Errorf("status text:\n%s", text)
		}
		t.Logf("OUTPUT meshlet status on a-x1:\n%s", text)
		nl, err := ax2.Exec(ctx, meshlet, "status")
		must(t, err)
		if !strings.Contains(nl, "Role: non-leader") {
			t.Errorf("a-x2 status:\n%s", nl)
		}
	})

	// The ClusterMesh's status, written by one of cluster-a's two leaders
	// (the Lease holder), as `kubectl get clustermesh` shows it.
	kubectl := func(args ...string) string {
		out, err := exec.CommandContext(ctx, filepath.Join(os.Getenv("MESHLET_K8S_BIN"), "kubectl"),
			append([]string{"--kubeconfig", a.AdminKubeconfig()}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	meshReady := func(want string) string {
		var out string
		must(t, harness.Poll(ctx, 30*time.Second, 200*time.Millisecond, "ClusterMesh Ready "+want, func() (bool, error) {
			out = kubectl("get", "clustermesh", "-n", harness.Namespace, "-o", "wide")
			fields := strings.Fields(strings.Split(strings.TrimSpace(out), "\n")[1])
			return len(fields) >= 3 && fields[2] == want, nil
		}))
		return out
	}
	t.Run("clustermesh status", func(t *testing.T) {
		t.Logf("OUTPUT kubectl get clustermesh -o wide:\n%s", meshReady("True"))
		// The writer is the leader of cluster-a's first segment, as every
		// agent's plan names it: exactly one node says it writes.
		var writers []string
		if err := harness.Poll(ctx, 15*time.Second, 200*time.Millisecond, "one ClusterMesh status writer, a leader", func() (bool, error) {
			writers = nil
			for _, n := range a.Nodes() {
				s, err := nodeStatus(ctx, n)
				if err != nil {
					return false, err
				}
				if s.ClusterMeshStatusWriter {
					writers = append(writers, n.Name)
				}
			}
			return len(writers) == 1 && (writers[0] == "a-x1" || writers[0] == "a-y1"), nil
		}); err != nil {
			t.Errorf("ClusterMesh status writers %v, want one of cluster-a's leaders a-x1, a-y1", writers)
		}
		st := kubectl("get", "clustermesh", "-n", harness.Namespace, "mesh", "-o", "jsonpath={.status.clusters}")
		if !strings.Contains(st, `"name":"cluster-b"`) || !strings.Contains(st, `"nodes":4`) || !strings.Contains(st, `"ready":true`) {
			t.Errorf("status.clusters = %s", st)
		}
	})

	diagnose := func(extra ...string) (string, int) {
		args := append([]string{"diagnose", "--kubeconfig", a.AdminKubeconfig(), "--namespace", harness.Namespace,
			"--cluster-name", a.Name, "--subnet", a.WGSubnet.String(), "--agents=false"}, extra...)
		out, err := exec.CommandContext(ctx, meshlet, args...).CombinedOutput()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return string(out), 0
		case errors.As(err, &ee):
			return string(out), ee.ExitCode()
		}
		t.Fatalf("meshlet diagnose: %v\n%s", err, out)
		return "", -1
	}
	t.Run("diagnose", func(t *testing.T) {
		out, code := diagnose()
		t.Logf("OUTPUT meshlet diagnose (healthy):\n%s", out)
		if code != 0 || strings.Contains(out, "ERROR") || strings.Contains(out, "WARNING") {
			t.Errorf("healthy mesh: exit status %d:\n%s", code, out)
		}
		for _, want := range []string{"OK       leaders", "cluster cluster-b: reachable with its Secret's read-only credentials: 4 nodes, 4 Ready", "8 nodes run meshlet"} {
			if !strings.Contains(out, want) && !(want == "8 nodes run meshlet" && strings.Contains(out, "4 nodes run meshlet, 0 run kg")) {
				t.Errorf("diagnose lacks %q:\n%s", want, out)
			}
		}
		// A malformed annotation and a remote API server that is down.
		bad := "every-minute"
		must(t, a.PatchNodeAnnotations(ctx, "a-y2", map[string]*string{"kilo.squat.ai/persistent-keepalive": &bad}))
		b.Server.Stop()
		defer b.Server.Start()
		t.Logf("OUTPUT kubectl get clustermesh -o wide (cluster-b's API down):\n%s", meshReady("False"))
		out, code = diagnose()
		t.Logf("OUTPUT meshlet diagnose (cluster-b's API down, a malformed annotation):\n%s", out)
		if code != 1 {
			t.Errorf("exit status %d with cluster-b down, want 1", code)
		}
		for _, want := range []string{"ERROR    remote clusters  cluster cluster-b: cannot be read", "WARNING  rejections       Node/a-y2: InvalidAnnotation kilo.squat.ai/persistent-keepalive"} {
			if !strings.Contains(out, want) {
				t.Errorf("diagnose lacks %q:\n%s", want, out)
			}
		}
		js, _ := diagnose("-o", "json")
		var fs []struct{ Severity, Check, Subject, Message, Fix string }
		if err := json.Unmarshal([]byte(strings.TrimSpace(js[:strings.LastIndex(js, "]")+1])), &fs); err != nil || len(fs) == 0 {
			t.Errorf("diagnose -o json: %v\n%s", err, js)
		}
	})

	t.Run("graph", func(t *testing.T) {
		// cluster-b's API server is back (the diagnose subtest restarted
		// it): poll until the graph has both clusters.
		var dot string
		must(t, harness.Poll(ctx, 60*time.Second, 500*time.Millisecond, "a graph with every node", func() (bool, error) {
			out, err := exec.CommandContext(ctx, meshlet, "graph", "--kubeconfig", a.AdminKubeconfig(), "--namespace", harness.Namespace,
				"--cluster-name", a.Name, "--subnet", a.WGSubnet.String()).Output()
			if err != nil {
				return false, err
			}
			dot = string(out)
			for _, n := range env.Nodes() {
				if !strings.Contains(dot, n.Name) {
					return false, errors.New("graph lacks node " + n.Name)
				}
			}
			return true, nil
		}))
		if !strings.HasPrefix(dot, "digraph") && !strings.HasPrefix(dot, "graph") {
			t.Errorf("not Graphviz dot:\n%s", dot)
		}
		if path, err := exec.LookPath("dot"); err == nil {
			c := exec.CommandContext(ctx, path, "-Tsvg")
			c.Stdin = strings.NewReader(dot)
			if svg, err := c.Output(); err != nil || !strings.Contains(string(svg), "<svg") {
				t.Errorf("dot -Tsvg: %v", err)
			}
		}
		t.Logf("OUTPUT meshlet graph:\n%s", dot)
	})
}
