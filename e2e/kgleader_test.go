package e2e

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshlet/meshlet/agent/core/failover"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/harness"
)

// Scenario 9b: a kg node joins a location that meshlet leads with its
// Lease. kg cannot follow a Lease, so the location falls back to Kilo's
// rule (docs/failover.md#governed): the holder releases the Lease
// (NotGoverned), meshlet's leader mark goes, every node — kg's stand-in
// too — elects the leader by Kilo's rule, and the agents' logs and
// meshlet diagnose say why.
func TestKgInLocationKeepsKilosRule(t *testing.T) {
	env, ctx := newEnv(t)
	must(t, env.Build(ctx, harness.OneCluster(2)))
	a := env.Cluster("cluster-a")
	x1, x2 := env.Node("a-x1"), env.Node("a-x2")
	if ld := leaderOf(t, ctx, x1, x2); ld != x1 {
		t.Fatalf("leader %s, want a-x1", ld.Name)
	}
	awaitMark(t, ctx, x1, x2)
	lease := failover.LeaseName("x")
	holder := func() string {
		l, err := a.Admin.CoordinationV1().Leases(harness.Namespace).Get(ctx, lease, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	if h := holder(); h != "a-x1" {
		t.Fatalf("Lease %s held by %q, want a-x1", lease, h)
	}

	// By name, a-kg1 comes first in Kilo's order once meshlet's mark is gone.
	kg, err := a.AddKgNode(ctx, "a-kg1", "x")
	must(t, err)
	must(t, harness.Poll(ctx, 30*time.Second, 200*time.Millisecond, "Kilo's rule in location x", func() (bool, error) {
		if h := holder(); h != "" {
			return false, nil
		}
		for _, n := range []*harness.Node{x1, x2} {
			if marked(t, ctx, n) {
				return false, nil
			}
			m, err := n.Metrics(ctx)
			if err != nil {
				return false, err
			}
			if v, _ := m.Value("meshlet_leader"); v != 0 {
				return false, nil
			}
		}
		ann, err := a.Annotations(ctx, kg.Name)
		return err == nil && ann[topology.AnnotationWireGuardIP] != "", err
	}))
	log, err := os.ReadFile(x1.LogPath)
	must(t, err)
	var said string
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, `"msg":"location leadership"`) && strings.Contains(line, `"governed":false`) {
			said = line
		}
	}
	if !strings.Contains(said, "kg runs on a-kg1 and cannot follow a Lease") {
		t.Errorf("a-x1's log does not say why location x keeps Kilo's rule: %q", said)
	}
	out, derr := exec.CommandContext(ctx, os.Getenv("MESHLET_BIN"), "diagnose", "--kubeconfig", a.AdminKubeconfig(), "--namespace", harness.Namespace,
		"--cluster-name", a.Name, "--subnet", a.WGSubnet.String(), "--agents=false").CombinedOutput()
	var finding string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "leadership") && strings.Contains(line, "location x") {
			finding = line
		}
	}
	if !strings.HasPrefix(finding, "WARNING") || !strings.Contains(finding, "kg runs on a-kg1") {
		t.Errorf("meshlet diagnose on location x: %q, want a warning naming a-kg1 (%v):\n%s", finding, derr, out)
	}
	_, err = x2.WaitReachable(ctx, kg.PodIP, 30*time.Second)
	must(t, err)
	report(t, "a kg node joined location x: Lease released, meshlet's mark removed, a-kg1 leads by Kilo's rule, a-x2 reaches it; a-x1 logged %q; meshlet diagnose: %q",
		jsonField(said, "why"), strings.Join(strings.Fields(finding), " "))
}

// jsonField extracts a string field from a JSON log line (for reports).
func jsonField(line, key string) string {
	i := strings.Index(line, `"`+key+`":"`)
	if i < 0 {
		return ""
	}
	rest := line[i+len(key)+4:]
	if j := strings.Index(rest, `"`); j >= 0 {
		return rest[:j]
	}
	return rest
}
