package node

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/meshlet/meshlet/agent/runtime/status"
)

// Linux capability bits (linux/capability.h): what the chart's
// privileged=false grants, and nothing else.
const (
	capNetAdmin = 12
	capNetRaw   = 13
)

// capLane is what the capability-only steps use of TestNodeLane's lane.
type capLane struct {
	ctx            context.Context
	t              *testing.T
	lane           *Lane
	cs             kubernetes.Interface
	chart          []string // the chart to upgrade to (reference, --version)
	pinger, target *corev1.Pod
}

// upgrade is `helm upgrade` of the lane's release to c.chart, its values
// kept, these set.
func (c *capLane) upgrade(set ...string) []string {
	args := append(append([]string{"upgrade", "meshlet"}, c.chart...), "--namespace", kiloNS, "--reuse-values")
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return args
}

// capabilityMode is the lane's step for the chart's privileged=false
// (docs/security.md#capabilities), with the userspace device as a child of
// the agent (sidecar false) or in the sidecar: the hosts' prerequisite
// sysctls set as an operator's sysctl.d would, `helm upgrade --set
// privileged=false`; pods Ready, no container privileged; every process of
// meshlet's with exactly the capabilities the chart grants (CapEff,
// CapPrm, CapBnd of /proc/<pid>/status), no new privileges, seccomp on; pod
// to pod ping across the mesh; meshlet status through kubectl exec (the
// socket on its emptyDir).
func (c *capLane) capabilityMode(sidecar bool) func() error {
	return func() error {
		ctx, t, lane := c.ctx, c.t, c.lane
		for _, n := range lane.Nodes() {
			// The prerequisite: forwarding on. rp_filter is 0 in the lane's
			// namespaces (all, default): kilo0's then serves as it is.
			if err := nodeSysctl(ctx, n, "net.ipv4.ip_forward", "1"); err != nil {
				return err
			}
		}
		start := time.Now()
		if _, err := lane.Helm(ctx, c.upgrade("privileged=false", "wireguard.sidecar="+strconv.FormatBool(sidecar))...); err != nil {
			return err
		}
		pods, err := waitPods(ctx, c.cs, len(lane.Nodes()), "unprivileged pods", func(p corev1.Pod) bool {
			return (len(p.Spec.InitContainers) == 1) == sidecar && !anyPrivileged(p)
		})
		if err != nil {
			return err
		}
		what := map[bool]string{false: "child device", true: "sidecar device"}[sidecar]
		for _, p := range pods {
			t.Logf("RESULT capability-only mode (%s): pod %s on %s Ready %.1fs after helm upgrade (restarts %d)", what, p.Name,
				p.Spec.NodeName, readySince(p).Sub(start).Seconds(), restarts(p))
		}
		// Every process of meshlet's on each node: `meshlet run` and the
		// userspace device (its child, or the sidecar's process).
		wantAgent := uint64(1<<capNetAdmin | 1<<capNetRaw)
		wantDevice := wantAgent
		if sidecar {
			wantDevice = 1 << capNetAdmin
		}
		for _, n := range lane.Nodes() {
			procs, err := meshletProcs(n)
			if err != nil {
				return err
			}
			if len(procs["run"]) != 1 || len(procs["wireguard-userspace"]) != 1 {
				return fmt.Errorf("%s: meshlet processes %v, want one run and one wireguard-userspace", n.Name, procs)
			}
			for _, pc := range []struct {
				cmd  string
				want uint64
			}{{"run", wantAgent}, {"wireguard-userspace", wantDevice}} {
				st, err := capStatus(fmt.Sprintf("/proc/%d/status", procs[pc.cmd][0]))
				if err != nil {
					return err
				}
				t.Logf("RESULT capability-only mode (%s): %s meshlet %s: CapEff %016x CapPrm %016x CapBnd %016x NoNewPrivs %s Seccomp %s",
					what, n.Name, pc.cmd, st.eff, st.prm, st.bnd, st.noNewPrivs, st.seccomp)
				if st.eff != pc.want || st.prm != pc.want || st.bnd != pc.want || st.noNewPrivs != "1" || st.seccomp != "2" {
					return fmt.Errorf("%s meshlet %s: CapEff %016x CapPrm %016x CapBnd %016x NoNewPrivs %s Seccomp %s; want capabilities %016x, NoNewPrivs 1, Seccomp 2 (filter)",
						n.Name, pc.cmd, st.eff, st.prm, st.bnd, st.noNewPrivs, st.seccomp, pc.want)
				}
			}
		}
		// The same from inside the agent's container, as a user checks it.
		pod := podOn(pods, lane.Nodes()[0].Name)
		out, err := lane.Kubectl(ctx, "exec", "-n", kiloNS, pod, "-c", "meshlet", "--", "cat", "/proc/1/status")
		if err != nil {
			return err
		}
		if st := parseCapStatus(out); st.eff != wantAgent {
			return fmt.Errorf("kubectl exec %s -- cat /proc/1/status: CapEff %016x, want %016x", pod, st.eff, wantAgent)
		}
		if err := poll(ctx, time.Minute, "ping in the capability-only mode", func() (bool, error) {
			r, err := ping(ctx, lane, c.pinger.Name, c.target.Status.PodIP, 3, "0.2")
			return err == nil && r.received > 0, err
		}); err != nil {
			return err
		}
		res, err := ping(ctx, lane, c.pinger.Name, c.target.Status.PodIP, 20, "0.1")
		if err != nil {
			return err
		}
		t.Logf("RESULT capability-only mode (%s): ping %s -> %s: %d/%d, %.1fs after helm upgrade", what, c.pinger.Spec.NodeName,
			c.target.Spec.NodeName, res.received, res.sent, time.Since(start).Seconds())
		if res.received == 0 {
			return fmt.Errorf("no ping answered in the capability-only mode")
		}
		if err := c.statusThroughExec(pod, lane.Nodes()[1].Name); err != nil {
			return err
		}
		// kilo0 came up with the namespace's default rp_filter (0), which
		// the agent cannot change to its 2 and leaves, saying so once.
		logs, err := lane.Kubectl(ctx, "logs", "-n", kiloNS, pod, "-c", "meshlet")
		if err != nil {
			return err
		}
		if !strings.Contains(logs, "sysctl left as the host set it") {
			return fmt.Errorf("%s's log does not say kilo0's rp_filter was left as it is:\n%s", pod, tail(logs, 20))
		}
		return nil
	}
}

// missingPrerequisite: forwarding turned off on node2's host, the agent
// there (which may not write /proc/sys) says which sysctl to set and is
// not Ready; set again, it is Ready without a restart.
func (c *capLane) missingPrerequisite() error {
	ctx, lane := c.ctx, c.lane
	n := lane.Nodes()[1]
	if err := nodeSysctl(ctx, n, "net.ipv4.ip_forward", "0"); err != nil {
		return err
	}
	start := time.Now()
	var pod corev1.Pod
	err := poll(ctx, 90*time.Second, n.Name+"'s agent not Ready, naming net.ipv4.ip_forward", func() (bool, error) {
		l, err := c.cs.CoreV1().Pods(kiloNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=meshlet", FieldSelector: "spec.nodeName=" + n.Name})
		if err != nil || len(l.Items) != 1 {
			return false, err
		}
		pod = l.Items[0]
		if podReady(pod) {
			return false, fmt.Errorf("%s still Ready", pod.Name)
		}
		logs, err := lane.Kubectl(ctx, "logs", "-n", kiloNS, pod.Name, "-c", "meshlet", "--since=2m")
		return err == nil && strings.Contains(logs, "set net.ipv4.ip_forward=1 on the host"), err
	})
	if err != nil {
		return err
	}
	notReady := time.Since(start)
	if err := nodeSysctl(ctx, n, "net.ipv4.ip_forward", "1"); err != nil {
		return err
	}
	start = time.Now()
	if err := poll(ctx, time.Minute, pod.Name+" Ready again", func() (bool, error) {
		p, err := c.cs.CoreV1().Pods(kiloNS).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if restarts(*p) != restarts(pod) {
			return false, fmt.Errorf("%s restarted (%d)", pod.Name, restarts(*p))
		}
		return podReady(*p), nil
	}); err != nil {
		return err
	}
	c.t.Logf("RESULT capability-only mode, net.ipv4.ip_forward=0 on %s: agent not Ready and naming the sysctl %.1fs after; Ready %.1fs after it was set again (no restart)",
		n.Name, notReady.Seconds(), time.Since(start).Seconds())
	return nil
}

// statusThroughExec: `meshlet status -o json` in the agent's container
// (the status socket on its emptyDir) shows the agent leading and peer up.
func (c *capLane) statusThroughExec(pod, peer string) error {
	return poll(c.ctx, time.Minute, "meshlet status in "+pod, func() (bool, error) {
		// Traffic while polling: a peer without keepalive is judged from
		// when traffic was sent to it.
		if _, err := ping(c.ctx, c.lane, c.pinger.Name, c.target.Status.PodIP, 2, "0.2"); err != nil {
			return false, err
		}
		out, err := c.lane.Kubectl(c.ctx, "exec", "-n", kiloNS, pod, "-c", "meshlet", "--", "meshlet", "status", "-o", "json")
		if err != nil {
			return false, err
		}
		var st status.Status
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			return false, fmt.Errorf("%w: %s", err, out)
		}
		for _, p := range st.Peers {
			if p.Name == peer {
				return st.Role == "leader" && p.State == "up", fmt.Errorf("role %q, %s %s", st.Role, p.Name, p.State)
			}
		}
		return false, fmt.Errorf("no peer %s in %+v", peer, st.Peers)
	})
}

// waitPods waits for one Ready meshlet pod per node, each as ok wants.
func waitPods(ctx context.Context, cs kubernetes.Interface, want int, what string, ok func(corev1.Pod) bool) ([]corev1.Pod, error) {
	var pods []corev1.Pod
	err := poll(ctx, 3*time.Minute, what, func() (bool, error) {
		l, err := cs.CoreV1().Pods(kiloNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=meshlet"})
		if err != nil {
			return false, err
		}
		pods = pods[:0]
		for _, p := range l.Items {
			if ok(p) && podReady(p) && p.DeletionTimestamp == nil {
				pods = append(pods, p)
			}
		}
		return len(pods) == want && len(l.Items) == want, fmt.Errorf("%d of %d pods as wanted and Ready", len(pods), len(l.Items))
	})
	return pods, err
}

func anyPrivileged(p corev1.Pod) bool {
	for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
		if sc := c.SecurityContext; sc == nil || sc.Privileged == nil || *sc.Privileged {
			return true
		}
	}
	return false
}

// nodeSysctl sets a sysctl in the node's network namespace, as the host's
// sysctl.d would.
func nodeSysctl(ctx context.Context, n *Node, key, value string) error {
	out, err := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+n.NS, "sysctl", "-qw", key+"="+value).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: sysctl %s=%s: %w %s", n.Name, key, value, err, out)
	}
	return nil
}

// meshletProcs are the pids of meshlet's processes in the node's network
// namespace, by subcommand.
func meshletProcs(n *Node) (map[string][]int, error) {
	out, err := exec.Command("ip", "netns", "pids", n.NS).Output()
	if err != nil {
		return nil, err
	}
	procs := map[string][]int{}
	for _, f := range strings.Fields(string(out)) {
		cmd, _ := os.ReadFile("/proc/" + f + "/cmdline")
		args := strings.Split(string(cmd), "\x00")
		if len(args) > 1 && strings.HasSuffix(args[0], "/meshlet") {
			pid, _ := strconv.Atoi(f)
			procs[args[1]] = append(procs[args[1]], pid)
		}
	}
	return procs, nil
}

type procCaps struct {
	eff, prm, bnd       uint64
	noNewPrivs, seccomp string
}

func capStatus(path string) (procCaps, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return procCaps{}, err
	}
	return parseCapStatus(string(b)), nil
}

// parseCapStatus reads the capability sets, NoNewPrivs and Seccomp of a
// /proc/<pid>/status.
func parseCapStatus(s string) procCaps {
	var c procCaps
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		x, _ := strconv.ParseUint(v, 16, 64)
		switch k {
		case "CapEff":
			c.eff = x
		case "CapPrm":
			c.prm = x
		case "CapBnd":
			c.bnd = x
		case "NoNewPrivs":
			c.noNewPrivs = v
		case "Seccomp":
			c.seccomp = v
		}
	}
	return c
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
