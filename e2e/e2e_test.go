// Package e2e runs meshlet end to end on this machine: real kube-apiservers,
// nodes as network namespaces, the real meshlet binary with userspace
// WireGuard on every node, a real NAT (see e2e/harness). Run with
// `make e2e` (root; MESHLET_BIN and MESHLET_K8S_BIN set by the Makefile).
// Each test logs its measured numbers; `make e2e` tees them into
// e2e-report.txt.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshlet/meshlet/agent/runtime/config"
	"github.com/meshlet/meshlet/agent/runtime/status"
	"github.com/meshlet/meshlet/e2e/apiserver"
	"github.com/meshlet/meshlet/e2e/harness"
)

// prereqs skips (or, with CI=true, fails) when the machine cannot run e2e.
func prereqs(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("e2e: needs root, network namespaces and API servers")
	}
	// Not SkipOrFail: `make test` (go test ./...) reaches this package too,
	// also in CI; the e2e suite runs from `make e2e`, which sets it.
	if os.Getenv("MESHLET_BIN") == "" {
		t.Skip("e2e: MESHLET_BIN not set (run `make e2e`)")
	}
	if os.Geteuid() != 0 {
		apiserver.SkipOrFail(t, "e2e: needs root")
	}
	for _, tool := range []string{"ip", "nft", "conntrack", "ping"} {
		if _, err := exec.LookPath(tool); err != nil {
			apiserver.SkipOrFail(t, "e2e: %s not installed (apt-get install iproute2 nftables conntrack iputils-ping)", tool)
		}
	}
	if _, err := apiserver.BinDir(); err != nil {
		apiserver.SkipOrFail(t, "e2e: no Kubernetes binaries: %v", err)
	}
}

// meshletArgs are the flags MESHLET_ARGS adds to every agent of a test
// (space-separated, e.g. "--leader-lease-duration=15s
// --leader-lease-renew=5s"): another point of the trade-off between
// failover time and the Lease holder's idle cost
// (docs/performance.md#lease-timing).
func meshletArgs() []string { return strings.Fields(os.Getenv("MESHLET_ARGS")) }

// leaseTiming is the location Lease's duration and renewal the agents of a
// test run with: MESHLET_ARGS read by meshlet's own flags, over its
// defaults.
func leaseTiming(t *testing.T) (duration, renew time.Duration) {
	t.Helper()
	var c config.Config
	fs := pflag.NewFlagSet("MESHLET_ARGS", pflag.ContinueOnError)
	fs.ParseErrorsAllowlist.UnknownFlags = true
	c.RegisterAgent(fs)
	if err := fs.Parse(meshletArgs()); err != nil {
		t.Fatalf("MESHLET_ARGS: %v", err)
	}
	return c.LeaseDuration, c.LeaseRenew
}

// newEnv returns a fresh harness, torn down when the test ends (also on
// failure, after dumping the tail of every meshlet log).
func newEnv(t *testing.T, tune ...func(*harness.Options)) (*harness.Env, context.Context) {
	t.Helper()
	prereqs(t)
	opts := harness.Options{Logf: t.Logf, KeepDir: os.Getenv("E2E_KEEP") != ""}
	opts.MeshletArgs = meshletArgs()
	for _, f := range tune {
		f(&opts)
	}
	env, err := harness.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range env.Nodes() {
				t.Logf("--- last lines of %s's meshlet log:\n%s", n.Name, n.LogTail(25))
			}
		} else {
			endFindings(t, env)
		}
		cancel()
		// Whatever the scenario, no node's private key may be in anything
		// the run wrote (docs/security.md#private-key).
		for _, l := range env.KeyLeaks(nil) {
			t.Errorf("private key leaked: %s", l)
		}
		// Every agent runs with exactly the shipped RBAC (manifests/base,
		// manifests/remote): none of its requests may be refused.
		for _, c := range env.Clusters() {
			refused, err := c.Server.Forbidden(apiserver.ByMeshlet)
			if err != nil {
				t.Errorf("cluster %s: reading the audit log: %v", c.Name, err)
			}
			for _, r := range refused {
				t.Errorf("cluster %s refused a request of meshlet's: %s", c.Name, r)
			}
		}
		env.Close()
	})
	return env, ctx
}

// expectedFindings holds, per test, the named findings it leaves in place
// on purpose (expectFindings); endFindings fails a test on any other.
var expectedFindings sync.Map // *testing.T → map[string]bool

// expectFindings declares findings ("<node> <ID>") a test leaves in place on
// purpose when it ends, so endFindings does not take them for false alarms.
func expectFindings(t *testing.T, named ...string) {
	m := map[string]bool{}
	for _, n := range named {
		m[n] = true
	}
	expectedFindings.Store(t, m)
}

// endFindings reads the named findings (issue 22's) in the status of every
// agent still running when a test ends and fails the test on any it did not
// declare with expectFindings: a healthy scenario reports none of them, so
// over the whole suite this is the record of false alarms. The fault
// scenarios (TestFindings) assert their own findings while they happen.
func endFindings(t *testing.T, env *harness.Env) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	want := map[string]bool{}
	if m, ok := expectedFindings.LoadAndDelete(t); ok {
		want = m.(map[string]bool)
	}
	var named []string
	agents := 0
	for _, n := range env.Nodes() {
		if !n.Running() {
			continue
		}
		out, err := n.Exec(ctx, os.Getenv("MESHLET_BIN"), "status", "-o", "json")
		if err != nil {
			continue // a kg node, or an agent going away
		}
		var st status.Status
		if json.Unmarshal([]byte(out), &st) != nil {
			continue
		}
		agents++
		for _, f := range st.Findings {
			if f.ID == "" {
				continue
			}
			named = append(named, n.Name+" "+f.ID)
			if !want[n.Name+" "+f.ID] {
				t.Errorf("false alarm: %s reports %s at the end of a scenario that did not cause it: %s", n.Name, f.ID, f.Message)
			}
		}
	}
	if len(named) == 0 {
		named = []string{"none"}
	}
	t.Logf("FINDINGS %s: named findings in %d agents' status at the end: %s", t.Name(), agents, strings.Join(named, ", "))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// report logs a result line in a form easy to grep from e2e-report.txt.
func report(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Logf("RESULT %s: %s", t.Name(), fmt.Sprintf(format, args...))
}

// percentile of sorted durations (nearest rank).
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p*float64(len(s))+0.999999) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(s) {
		i = len(s) - 1
	}
	return s[i]
}

// leaderOf returns the node whose meshlet reports meshlet_leader 1 among
// nodes, polling until exactly one does.
func leaderOf(t *testing.T, ctx context.Context, nodes ...*harness.Node) *harness.Node {
	t.Helper()
	var leader *harness.Node
	err := harness.Poll(ctx, 30*time.Second, 200*time.Millisecond, "one leader", func() (bool, error) {
		leader = nil
		count := 0
		for _, n := range nodes {
			if !n.Running() {
				continue
			}
			m, err := n.Metrics(ctx)
			if err != nil {
				return false, err
			}
			if v, _ := m.Value("meshlet_leader"); v == 1 {
				leader = n
				count++
			}
		}
		return count == 1, fmt.Errorf("%d leaders", count)
	})
	must(t, err)
	return leader
}

func names(m map[string]string) string {
	var s []string
	for _, v := range m {
		s = append(s, v)
	}
	sort.Strings(s)
	return strings.Join(s, ",")
}

// pace waits d between samples of a state observed over a period (e.g. an
// endpoint across resyncs): it paces observation and never decides the
// outcome, which the samples do.
func pace(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// eventWant is an Event a scenario waits for: on object kind/name, with one
// of reasons, its message containing mentions ("" = any).
type eventWant struct {
	kind, name string
	reasons    []string
	mentions   string
}

// awaitEvents waits up to timeout until cluster c holds an Event for each
// of wants, logs every Event of c, and returns them with what is still
// missing as the error.
func awaitEvents(t *testing.T, ctx context.Context, c *harness.Cluster, timeout time.Duration, what string, wants []eventWant) ([]corev1.Event, error) {
	t.Helper()
	var evs []corev1.Event
	missing := func() []string {
		var out []string
		for _, w := range wants {
			found := false
			for _, e := range evs {
				if e.InvolvedObject.Kind == w.kind && e.InvolvedObject.Name == w.name && contains(w.reasons, e.Reason) &&
					strings.Contains(e.Message, w.mentions) {
					found = true
				}
			}
			if !found {
				out = append(out, fmt.Sprintf("%s/%s %v %q", w.kind, w.name, w.reasons, w.mentions))
			}
		}
		return out
	}
	err := harness.Poll(ctx, timeout, 200*time.Millisecond, what, func() (bool, error) {
		l, err := c.Admin.CoreV1().Events("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		evs = l.Items
		m := missing()
		return len(m) == 0, fmt.Errorf("missing %v", m)
	})
	var lines []string
	for _, e := range evs {
		lines = append(lines, fmt.Sprintf("%s/%s %s: %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message))
	}
	sort.Strings(lines)
	t.Logf("events in %s:\n  %s", c.Name, strings.Join(lines, "\n  "))
	return evs, err
}
