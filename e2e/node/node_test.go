package node

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/meshlet/meshlet/agent/runtime/status"
	"github.com/meshlet/meshlet/e2e/apiserver"
	"github.com/meshlet/meshlet/e2e/harness"
)

const kiloNS = "kilo-system"

// repoRoot is two levels up from e2e/node.
func repoRoot(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func env(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		apiserver.SkipOrFail(t, "%s is not set (make e2e-node sets it)", name)
	}
	return v
}

// laneRelease checks what every test of this lane needs (make e2e-node's
// environment, root) and returns this tree's release (make release's dist/).
func laneRelease(t *testing.T) Release {
	t.Helper()
	if os.Getenv("MESHLET_DIST") == "" {
		t.Skip("MESHLET_DIST is not set: make e2e-node runs this lane")
	}
	if os.Geteuid() != 0 {
		t.Fatal("needs root: network, mount and cgroup namespaces, kubelet, containerd")
	}
	cur, err := CurrentRelease(env(t, "MESHLET_DIST"))
	if err != nil {
		t.Fatal(err)
	}
	return cur
}

// TestNodeLane is make e2e-node: README.md says what each step proves.
func TestNodeLane(t *testing.T) {
	// This tree's release and the previous one (hack/release/previous.sh),
	// both installed from the lane's registry.
	cur := laneRelease(t)
	prev, err := PreviousRelease(env(t, "MESHLET_PREVIOUS"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("RESULT releases: N %s (chart %s), N-1 %s (chart %s, %s commit %s)", cur.Version, cur.ChartVersion,
		prev.Version, prev.ChartVersion, prev.From, prev.Rev)
	bins := Bins{K8s: env(t, "MESHLET_K8S_BIN"), Node: env(t, "MESHLET_NODE_BIN"), Tools: env(t, "MESHLET_TOOLS_BIN")}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "meshlet-e2e-node-")
	if err != nil {
		t.Fatal(err)
	}
	lane := NewLane(dir, bins, t.Logf)
	t.Cleanup(func() {
		start := time.Now()
		lane.Teardown()
		t.Logf("RESULT teardown %.1fs (logs kept in %s)", time.Since(start).Seconds(), dir)
		if !t.Failed() {
			os.RemoveAll(dir)
		}
	})
	step := func(name string, fn func() error) {
		t.Helper()
		start := time.Now()
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Logf("RESULT step %-28s %6.1fs", name, time.Since(start).Seconds())
	}
	root := repoRoot(t)
	nodes := 2
	step("network namespaces", func() error { return lane.Network(nodes) })
	step("pki", lane.PKI)
	step("control plane ready", func() error { return lane.ControlPlane(ctx) })
	admin := lane.Config("admin")
	cs := kubernetes.NewForConfigOrDie(admin)
	dyn := dynamic.NewForConfigOrDie(admin)

	step("images pushed", func() error { return pushImages(ctx, t, lane, cur.ImageTar, dir) })
	// As the release workflow publishes to ghcr.io: hack/release/publish.sh
	// (crane push --index, helm push), here to the lane's registry, which
	// containerd mirrors for ghcr.io. The previous release: its image under
	// its version and, as its chart's default was, :latest.
	chartRef := "oci://" + lane.Registry() + "/meshlet/charts/meshlet"
	// Signed as the release workflow signs, with a key pair of the test's
	// own where the workflow signs keyless (docs/releasing.md#verify).
	key := filepath.Join(dir, "release")
	tools := "PATH=" + bins.Tools + ":" + os.Getenv("PATH")
	step("release published and signed (publish.sh SIGN=key)", func() error {
		if out, err := lane.InNS(ctx, "env", "COSIGN_PASSWORD=", filepath.Join(bins.Tools, "cosign"), "generate-key-pair",
			"--output-key-prefix", key); err != nil {
			return fmt.Errorf("cosign generate-key-pair: %w: %s", err, out)
		}
		out, err := lane.InNS(ctx, "env", tools, "PLAIN_HTTP=1", "SIGN=key", "COSIGN_KEY="+key+".key", "COSIGN_PASSWORD=",
			filepath.Join(root, "hack", "release", "publish.sh"), filepath.Dir(cur.ImageTar), lane.Registry()+"/meshlet")
		t.Logf("OUTPUT publish.sh:\n%s", out)
		if err != nil {
			return err
		}
		if err := pushLayout(ctx, lane, prev.ImageTar, dir, "prev", lane.Registry()+"/meshlet/meshlet:"+prev.Version, lane.Registry()+"/meshlet/meshlet:latest"); err != nil {
			return err
		}
		_, err = lane.Helm(ctx, "push", prev.ChartTgz, "oci://"+lane.Registry()+"/meshlet/charts", "--plain-http")
		return err
	})
	// The values of this lane, the same for every release installed.
	laneValues := []string{"--set", "wireguard.sidecar=true",
		// As a Talos node reaches KubePrism: the API server's address
		// straight, not the kubernetes Service (no kube-proxy here).
		"--set", "apiServer.host=" + cpIP, "--set", "apiServer.port=" + strconv.Itoa(apiPort),
		// No Cilium on these nodes: Kilo's plain mode.
		"--set", "compatibility=",
		// helm test reads the agents' status too (an operator's grant).
		"--set", "tests.agents=true"}
	// N is installed only as verify.sh verified it: its chart by the
	// digest the signature is for; N-1 (from git history) is unsigned.
	var verifiedChart, verifiedImage string
	fromRegistry := func(version string) []string {
		if version == cur.ChartVersion {
			if verifiedChart == "" {
				t.Fatalf("installing %s before verify.sh verified it", version)
			}
			return []string{verifiedChart, "--plain-http"}
		}
		return []string{chartRef, "--version", version, "--plain-http"}
	}
	step("release verified (verify.sh); a tampered chart and image refused", func() error {
		var err error
		verifiedImage, verifiedChart, err = verifyRelease(ctx, t, lane, root, tools, key+".pub", cur, prev)
		return err
	})
	prevTag := "latest" // the N-1 chart's default image tag

	for _, n := range lane.Nodes() {
		n := n
		step("kubelet "+n.Name+" Ready", func() error {
			if err := lane.StartNode(ctx, n, "meshlet.io/agent=true"); err != nil {
				return err
			}
			return waitNodeReady(ctx, cs, n.Name, 2*time.Minute)
		})
		// The pod CIDR is set by hand (no node IPAM here); the location and
		// endpoint are what a user annotates (manifests/examples).
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"kilo.squat.ai/location":"loc-%d","kilo.squat.ai/force-endpoint":"%s:51820"}},"spec":{"podCIDR":"%s","podCIDRs":["%s"]}}`,
			n.Index, n.IP, n.PodCIDR, n.PodCIDR)
		if _, err := cs.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// A Peer of Kilo's, there before meshlet: uninstall must leave it.
	kiloPeer := `{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"kilo-laptop"},"spec":{"allowedIPs":["10.5.0.1/32"],"publicKey":"GY5aT1N9dTR/nJnT1N2f4ClZWVj0jOAld0r8ysWLyjg=","persistentKeepalive":10}}`
	step("install (crds, namespace, helm)", func() error {
		for _, k := range []string{"crds", "namespace"} {
			if _, err := lane.Kubectl(ctx, "apply", "--server-side", "-k", filepath.Join(root, "manifests", k)); err != nil {
				return err
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "peer.json"), []byte(kiloPeer), 0o644); err != nil {
			return err
		}
		if _, err := lane.Kubectl(ctx, "apply", "-f", filepath.Join(dir, "peer.json")); err != nil {
			return err
		}
		return nil
	})
	installStart := time.Now()
	step("helm install N-1 (oci)", func() error {
		_, err := lane.Helm(ctx, append(append([]string{"install", "meshlet"}, fromRegistry(prev.ChartVersion)...),
			append([]string{"--namespace", kiloNS}, laneValues...)...)...)
		return err
	})
	var pods []corev1.Pod
	step("meshlet pods Ready", func() error {
		var err error
		pods, err = waitDaemonSetPods(ctx, cs, prevTag, nodes, 3*time.Minute)
		return err
	})
	for _, p := range pods {
		t.Logf("RESULT pod %s on %s: Ready %.1fs after helm install (restarts %d)", p.Name, p.Spec.NodeName,
			readySince(p).Sub(installStart).Seconds(), restarts(p))
	}

	step("annotations published", func() error { return waitAnnotations(ctx, cs, lane.Nodes(), time.Minute) })
	httpc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: NSDialer("/run/netns/" + lane.CPNS())}}
	step("metrics served", func() error {
		for _, n := range lane.Nodes() {
			m, err := metrics(ctx, httpc, n)
			if err != nil {
				return err
			}
			if !strings.Contains(m, "meshlet_peers{") || !strings.Contains(m, "meshlet_leader 1") {
				return fmt.Errorf("%s metrics lack meshlet_peers / meshlet_leader 1:\n%.600s", n.Name, m)
			}
		}
		return nil
	})

	// Pods on both nodes, pinging each other's pod address over the mesh.
	var pinger, target *corev1.Pod
	step("ping pods Running", func() error {
		var err error
		pinger, err = startPingPod(ctx, cs, "pinger", lane.Nodes()[0].Name)
		if err != nil {
			return err
		}
		target, err = startPingPod(ctx, cs, "target", lane.Nodes()[1].Name)
		return err
	})
	step("pod to pod across the mesh", func() error {
		res, err := ping(ctx, lane, pinger.Name, target.Status.PodIP, 5, "0.2")
		if err != nil {
			return err
		}
		if res.received == 0 {
			return fmt.Errorf("no reply from %s: %s", target.Status.PodIP, res.raw)
		}
		t.Logf("RESULT ping %s(%s) -> %s(%s): %d/%d", pinger.Spec.NodeName, pinger.Status.PodIP, target.Spec.NodeName, target.Status.PodIP, res.received, res.sent)
		return nil
	})

	// N-1 -> N -> N-1 (and N again for the rest of the lane) while the
	// pod on node1 pings the one on node2 10 times a second: pings lost,
	// the longest gap; every node's annotations rewritten by the new
	// version unchanged, every location's Lease held and renewed, no object
	// left that the release's manifest does not hold.
	transition := func(what, wantTag string, count int, helmArgs ...string) func() error {
		return func() error {
			before, err := readNodeStates(ctx, cs, lane.Nodes())
			if err != nil {
				return err
			}
			pingDone := pingAsync(ctx, lane, pinger.Name, target.Status.PodIP, count, "0.1")
			start := time.Now()
			if _, err := lane.Helm(ctx, helmArgs...); err != nil {
				<-pingDone
				return err
			}
			newPods, err := waitDaemonSetPods(ctx, cs, wantTag, nodes, 4*time.Minute)
			rolled := time.Since(start)
			res := <-pingDone
			if err != nil {
				return err
			}
			if res.err != nil {
				return res.err
			}
			pods = newPods
			if err := checkAcrossVersions(ctx, cs, lane.Nodes(), before, start); err != nil {
				return err
			}
			manifest, err := lane.Helm(ctx, "get", "manifest", "meshlet", "--namespace", kiloNS)
			if err != nil {
				return err
			}
			extra, err := orphans(ctx, dyn, manifest)
			if err != nil {
				return err
			}
			// Each node leads its location (one node each) under the
			// version now running.
			for _, n := range lane.Nodes() {
				if err := poll(ctx, time.Minute, n.Name+" leads its location", func() (bool, error) {
					m, err := metrics(ctx, httpc, n)
					return err == nil && strings.Contains(m, "\nmeshlet_leader 1\n"), err
				}); err != nil {
					return err
				}
			}
			t.Logf("RESULT %s: rollout %.1fs; %d/%d pings lost (10/s) over %d gaps %v, longest %s; annotations kept and rewritten by the new agents, each node its location's leader, %d location Leases (all held and renewed); orphaned objects %d %v",
				what, rolled.Seconds(), res.sent-res.received, res.sent, len(res.gaps()), res.gaps(), res.longestGap(), leaseCount(ctx, cs), len(extra), extra)
			if len(extra) > 0 {
				return fmt.Errorf("objects left behind: %v", extra)
			}
			if res.received == 0 {
				return fmt.Errorf("no ping answered during %s", what)
			}
			return nil
		}
	}
	upgradeArgs := func(version string) []string {
		return append(append([]string{"upgrade", "meshlet"}, fromRegistry(version)...),
			append([]string{"--namespace", kiloNS, "--reset-values"}, laneValues...)...)
	}
	step("upgrade N-1 -> N (oci)", transition("upgrade "+prev.Version+" -> "+cur.Version, cur.Version, 300, upgradeArgs(cur.ChartVersion)...))
	step("N's pods run the image verify.sh verified", func() error {
		_, digest, _ := strings.Cut(verifiedImage, "@")
		l, err := cs.CoreV1().Pods(kiloNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=meshlet"})
		if err != nil {
			return err
		}
		for _, p := range l.Items {
			for _, c := range p.Status.ContainerStatuses {
				if c.Name == "meshlet" && !strings.HasSuffix(c.ImageID, "@"+digest) {
					return fmt.Errorf("pod %s runs %s (%s), not the verified %s", p.Name, c.Image, c.ImageID, digest)
				}
			}
		}
		t.Logf("RESULT release: N's %d pods run the verified image index %s", len(l.Items), digest)
		return nil
	})
	step("helm test (meshlet diagnose)", func() error {
		out, err := lane.Helm(ctx, "test", "meshlet", "--namespace", kiloNS, "--logs", "--timeout", "3m")
		t.Logf("OUTPUT helm test meshlet --logs:\n%s", out)
		if err != nil {
			return err
		}
		if !strings.Contains(out, "Succeeded") || !strings.Contains(out, "every judged peer of the 2 agents read is up") {
			return fmt.Errorf("helm test did not pass with every peer up")
		}
		return nil
	})
	step("rollback N -> N-1", transition("rollback "+cur.Version+" -> "+prev.Version, prevTag, 300,
		"rollback", "meshlet", "1", "--namespace", kiloNS))
	step("upgrade N-1 -> N again", transition("upgrade "+prev.Version+" -> "+cur.Version+" (after the rollback)", cur.Version, 300,
		upgradeArgs(cur.ChartVersion)...))

	n1, n2 := lane.Nodes()[0], lane.Nodes()[1]
	// The operator's view on real pods: `meshlet status` inside the agent's
	// container, the same through the API server's pod proxy, and
	// `meshlet diagnose` reading the DaemonSet's flags and every agent.
	meshletBin := env(t, "MESHLET_BIN")
	step("meshlet status (kubectl exec, pod proxy)", func() error {
		pod := podOn(pods, n1.Name)
		var st status.Status
		err := harness.Poll(ctx, 60*time.Second, 500*time.Millisecond, n1.Name+"'s peer judged up", func() (bool, error) {
			// Traffic while polling: a peer without keepalive is judged from
			// when traffic was sent to it.
			if _, err := ping(ctx, lane, pinger.Name, target.Status.PodIP, 2, "0.2"); err != nil {
				return false, err
			}
			out, err := lane.Kubectl(ctx, "exec", "-n", kiloNS, pod, "-c", "meshlet", "--", "meshlet", "status", "-o", "json")
			if err != nil {
				return false, err
			}
			st = status.Status{}
			if err := json.Unmarshal([]byte(out), &st); err != nil {
				return false, fmt.Errorf("%w: %s", err, out)
			}
			// The other node; the Kilo Peer kilo-laptop never connects.
			for _, p := range st.Peers {
				if p.Name == n2.Name {
					return st.Role == "leader" && p.State == "up", fmt.Errorf("role %q, %s %s", st.Role, p.Name, p.State)
				}
			}
			return false, fmt.Errorf("no peer %s in %+v", n2.Name, st.Peers)
		})
		if err != nil {
			return err
		}
		text, err := lane.Kubectl(ctx, "exec", "-n", kiloNS, pod, "-c", "meshlet", "--", "meshlet", "status")
		if err != nil {
			return err
		}
		t.Logf("OUTPUT kubectl exec -n kilo-system %s -c meshlet -- meshlet status:\n%s", pod, text)
		viaProxy, err := lane.InNS(ctx, meshletBin, "status", "--node", n2.Name, "--namespace", kiloNS)
		if err != nil {
			return err
		}
		if !strings.Contains(viaProxy, "Node "+n2.Name) || !strings.Contains(viaProxy, "Role: leader") {
			return fmt.Errorf("meshlet status --node %s:\n%s", n2.Name, viaProxy)
		}
		return nil
	})
	step("meshlet diagnose (DaemonSet flags, every agent)", func() error {
		out, err := lane.InNS(ctx, meshletBin, "diagnose", "--namespace", kiloNS)
		t.Logf("OUTPUT meshlet diagnose:\n%s", out)
		if err != nil {
			return err
		}
		for _, want := range []string{"agents 2 read", "topology from DaemonSet kilo-system/meshlet", "every judged peer of the 2 agents read is up"} {
			if !strings.Contains(out, want) {
				return fmt.Errorf("diagnose lacks %q", want)
			}
		}
		return nil
	})

	// 1. The agent's container restarts (killed), the sidecar's device stays.
	step("agent container restart", func() error {
		hs, err := handshake(ctx, httpc, n1, n2.Name)
		if err != nil {
			return err
		}
		pingDone := pingAsync(ctx, lane, pinger.Name, target.Status.PodIP, 100, "0.2")
		if err := killAgent(n1); err != nil {
			return err
		}
		if _, err := waitRestarted(ctx, cs, n1.Name, restartsOf(pods, n1.Name), time.Minute); err != nil {
			return err
		}
		res := <-pingDone
		if res.err != nil {
			return res.err
		}
		hs2, err := handshake(ctx, httpc, n1, n2.Name)
		if err != nil {
			return err
		}
		t.Logf("RESULT agent container restart on %s: %d/%d pings lost (longest gap %s), handshake %s -> %s (%s)",
			n1.Name, res.sent-res.received, res.sent, res.longestGap(), hs.Format(time.TimeOnly), hs2.Format(time.TimeOnly),
			map[bool]string{true: "same session", false: "new handshake"}[hs.Equal(hs2)])
		if res.sent-res.received > 0 {
			t.Errorf("pings lost across an agent container restart with the sidecar's device: %d", res.sent-res.received)
		}
		return nil
	})

	// 2. A new image tag rolls the DaemonSet while pinging: first without
	// keepalive (the peer that was not replaced keeps its stale session
	// until WireGuard's 15 s without an answer), then with Kilo's
	// persistent-keepalive annotation (the new device handshakes at once).
	roll := func(tag, what string, count int) func() error {
		return func() error {
			hs, err := handshake(ctx, httpc, n1, n2.Name)
			if err != nil {
				return err
			}
			pingDone := pingAsync(ctx, lane, pinger.Name, target.Status.PodIP, count, "0.2")
			rollStart := time.Now()
			if _, err := lane.Helm(ctx, append(append([]string{"upgrade", "meshlet"}, fromRegistry(cur.ChartVersion)...),
				"--namespace", kiloNS, "--reuse-values", "--set", "image.tag="+tag)...); err != nil {
				return err
			}
			newPods, err := waitDaemonSetPods(ctx, cs, tag, nodes, 4*time.Minute)
			if err != nil {
				return err
			}
			rolled := time.Since(rollStart)
			res := <-pingDone
			if res.err != nil {
				return res.err
			}
			hs2, err := handshake(ctx, httpc, n1, n2.Name)
			if err != nil {
				return err
			}
			for _, p := range newPods {
				t.Logf("RESULT rolled pod %s on %s Ready %.1fs after helm upgrade", p.Name, p.Spec.NodeName, readySince(p).Sub(rollStart).Seconds())
			}
			t.Logf("RESULT rolling update to %s (userspace WireGuard in a sidecar, %s): rollout %.1fs; %d/%d pings lost over %d gaps %v (longest %s); sessions %s (handshake %s -> %s)",
				tag, what, rolled.Seconds(), res.sent-res.received, res.sent, len(res.gaps()), res.gaps(), res.longestGap(),
				map[bool]string{true: "kept", false: "re-created"}[hs.Equal(hs2)], hs.Format(time.TimeOnly), hs2.Format(time.TimeOnly))
			if res.received == 0 {
				return fmt.Errorf("no ping answered during the rolling update")
			}
			after, err := ping(ctx, lane, pinger.Name, target.Status.PodIP, 5, "0.2")
			if err != nil || after.received == 0 {
				return fmt.Errorf("mesh after the rolling update: %v %s", err, after.raw)
			}
			return nil
		}
	}
	step("rolling update, no keepalive", roll("e2e2", "no keepalive", 450))
	step("keepalive 25 s on both nodes", func() error {
		for _, n := range lane.Nodes() {
			patch := `{"metadata":{"annotations":{"kilo.squat.ai/persistent-keepalive":"25"}}}`
			if _, err := cs.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				return err
			}
		}
		for _, pair := range [][2]*Node{{n1, n2}, {n2, n1}} {
			re := regexp.MustCompile(`(?m)^meshlet_peer_persistent_keepalive_seconds\{[^}]*peer="` + pair[1].Name + `"[^}]*\} 25$`)
			if err := poll(ctx, time.Minute, pair[0].Name+" keepalive 25 towards "+pair[1].Name, func() (bool, error) {
				m, err := metrics(ctx, httpc, pair[0])
				return err == nil && re.MatchString(m), err
			}); err != nil {
				return err
			}
		}
		return nil
	})
	step("rolling update, keepalive 25 s", roll("e2e1", "keepalive 25 s", 300))

	// 3. The chart's default: no sidecar; the agent starts the userspace
	// device as a child in its own container (read-only root, emptyDir at
	// /var/run/wireguard).
	step("default userspace device (no sidecar)", func() error {
		if _, err := lane.Helm(ctx, append(append([]string{"upgrade", "meshlet"}, fromRegistry(cur.ChartVersion)...),
			"--namespace", kiloNS, "--reuse-values", "--set", "wireguard.sidecar=false", "--set", "image.tag=e2e2")...); err != nil {
			return err
		}
		if err := poll(ctx, 3*time.Minute, "pods without the sidecar", func() (bool, error) {
			l, err := cs.CoreV1().Pods(kiloNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=meshlet"})
			if err != nil {
				return false, err
			}
			ready := 0
			for _, p := range l.Items {
				if len(p.Spec.InitContainers) == 0 && podReady(p) && p.DeletionTimestamp == nil {
					ready++
				}
			}
			return ready == nodes && len(l.Items) == nodes, nil
		}); err != nil {
			return err
		}
		return poll(ctx, time.Minute, "ping with the child device", func() (bool, error) {
			r, err := ping(ctx, lane, pinger.Name, target.Status.PodIP, 3, "0.2")
			return err == nil && r.received > 0, err
		})
	})

	// 4. The capability-only mode, privileged=false (capability_test.go).
	capl := &capLane{ctx: ctx, t: t, lane: lane, cs: cs, chart: fromRegistry(cur.ChartVersion), pinger: pinger, target: target}
	step("capability-only, child device", capl.capabilityMode(false))
	step("capability-only, sidecar", capl.capabilityMode(true))
	step("capability-only, no forwarding", capl.missingPrerequisite)

	step("helm uninstall keeps Kilo's objects", func() error {
		if _, err := lane.Helm(ctx, "uninstall", "meshlet", "--namespace", kiloNS, "--wait"); err != nil {
			return err
		}
		if _, err := cs.AppsV1().DaemonSets(kiloNS).Get(ctx, "meshlet", metav1.GetOptions{}); err == nil {
			return fmt.Errorf("DaemonSet meshlet still there after helm uninstall")
		}
		for _, obj := range [][]string{{"crd", "peers.kilo.squat.ai"}, {"peers.kilo.squat.ai", "kilo-laptop"}, {"namespace", kiloNS}} {
			if _, err := lane.Kubectl(ctx, "get", obj[0], obj[1]); err != nil {
				return fmt.Errorf("after helm uninstall: %w", err)
			}
		}
		return nil
	})
}

// pushLayout pushes an OCI layout tarball's index under every ref.
func pushLayout(ctx context.Context, lane *Lane, image, dir, name string, refs ...string) error {
	layout := filepath.Join(dir, name)
	if err := os.MkdirAll(layout, 0o755); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "tar", "-xf", image, "-C", layout).CombinedOutput(); err != nil {
		return fmt.Errorf("unpacking %s: %w %s", image, err, out)
	}
	for _, ref := range refs {
		if _, err := lane.Crane(ctx, "push", "--index", layout, ref); err != nil {
			return err
		}
	}
	return nil
}

// pushImages pushes this tree's image as e2e1 and e2e2 (the rolling updates'
// tags), a pause image and a busybox image.
func pushImages(ctx context.Context, t *testing.T, lane *Lane, image, dir string) error {
	if err := pushLayout(ctx, lane, image, dir, "image", lane.Registry()+"/meshlet/meshlet:e2e1", lane.Registry()+"/meshlet/meshlet:e2e2"); err != nil {
		return err
	}
	// The sandbox (pause) image and a busybox image for the ping pods.
	pause := filepath.Join(dir, "pause-bin")
	build := exec.CommandContext(ctx, "go", "build", "-o", pause, "./pause")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building pause: %w %s", err, out)
	}
	// wireguard-go for the userspace kg shapes' sidecar: the module this
	// tree's userspace device is built on, whose root is the daemon.
	wggo := filepath.Join(dir, "wireguard-go")
	build = exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", wggo, "golang.zx2c4.com/wireguard")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building wireguard-go: %w %s", err, out)
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return fmt.Errorf("busybox (Debian busybox-static): %w", err)
	}
	for _, img := range []struct {
		name, tarFile string
		files         map[string]string // path in image -> host file ("" = symlink to busybox)
		entrypoint    string            // "": none, the pod's args are the command (PATH /bin)
	}{
		{"e2e/pause:1", filepath.Join(dir, "pause.tar"), map[string]string{"pause": pause}, "/pause"},
		{"e2e/busybox:1", filepath.Join(dir, "busybox.tar"), map[string]string{"bin/busybox": bb, "bin/sh": "", "bin/ping": "", "bin/sleep": ""}, "/bin/sleep"},
		{"e2e/wireguard-go:1", filepath.Join(dir, "wireguard-go.tar"), map[string]string{"bin/wireguard-go": wggo}, ""},
	} {
		if err := layerTar(img.tarFile, img.files); err != nil {
			return err
		}
		ref := lane.Registry() + "/" + img.name
		if _, err := lane.Crane(ctx, "append", "--oci-empty-base", "-f", img.tarFile, "-t", ref); err != nil {
			return err
		}
		mutate := []string{"mutate", ref, "--env=PATH=/bin", "--set-platform=linux/amd64", "-t", ref}
		if img.entrypoint != "" {
			mutate = append(mutate, "--entrypoint="+img.entrypoint)
		}
		if _, err := lane.Crane(ctx, mutate...); err != nil {
			return err
		}
	}
	return nil
}

func layerTar(path string, files map[string]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "bin/", Mode: 0o755}); err != nil {
		return err
	}
	for _, n := range names {
		src := files[n]
		if src == "" {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: n, Linkname: "busybox", Mode: 0o777}); err != nil {
				return err
			}
			continue
		}
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o755, Size: int64(len(b))}); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
	}
	return tw.Close()
}

func poll(ctx context.Context, timeout time.Duration, what string, fn func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		ok, err := fn()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not within %s (last error: %v)", what, timeout, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func waitNodeReady(ctx context.Context, cs kubernetes.Interface, name string, timeout time.Duration) error {
	return poll(ctx, timeout, "node "+name+" Ready", func() (bool, error) {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, fmt.Errorf("%s: %s", c.Reason, c.Message)
			}
		}
		return false, nil
	})
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func readySince(p corev1.Pod) time.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

func restarts(p corev1.Pod) int32 {
	var n int32
	for _, s := range p.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}

// waitDaemonSetPods waits for one Ready meshlet pod per node, all running
// the image tag.
func waitDaemonSetPods(ctx context.Context, cs kubernetes.Interface, tag string, want int, timeout time.Duration) ([]corev1.Pod, error) {
	var pods []corev1.Pod
	err := poll(ctx, timeout, "meshlet pods "+tag+" Ready", func() (bool, error) {
		l, err := cs.CoreV1().Pods(kiloNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=meshlet"})
		if err != nil {
			return false, err
		}
		pods = pods[:0]
		var state []string
		for _, p := range l.Items {
			state = append(state, fmt.Sprintf("%s %s ready=%v %s", p.Name, p.Spec.Containers[0].Image, podReady(p), p.Status.Phase))
			if strings.HasSuffix(p.Spec.Containers[0].Image, ":"+tag) && podReady(p) && p.DeletionTimestamp == nil {
				pods = append(pods, p)
			}
		}
		return len(pods) == want && len(l.Items) == want, fmt.Errorf("pods: %s", strings.Join(state, "; "))
	})
	return pods, err
}

// podOn is the name of the pod of pods on node.
func podOn(pods []corev1.Pod, node string) string {
	for _, p := range pods {
		if p.Spec.NodeName == node {
			return p.Name
		}
	}
	return ""
}

func restartsOf(pods []corev1.Pod, node string) int32 {
	for _, p := range pods {
		if p.Spec.NodeName == node {
			return restarts(p)
		}
	}
	return 0
}

// waitRestarted waits for the node's meshlet pod to count one more restart
// and be Ready again.
func waitRestarted(ctx context.Context, cs kubernetes.Interface, node string, before int32, timeout time.Duration) (corev1.Pod, error) {
	var got corev1.Pod
	err := poll(ctx, timeout, "meshlet on "+node+" restarted and Ready", func() (bool, error) {
		l, err := cs.CoreV1().Pods(kiloNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=meshlet", FieldSelector: "spec.nodeName=" + node})
		if err != nil || len(l.Items) != 1 {
			return false, err
		}
		got = l.Items[0]
		return restarts(got) > before && podReady(got), nil
	})
	return got, err
}

func waitAnnotations(ctx context.Context, cs kubernetes.Interface, nodes []*Node, timeout time.Duration) error {
	for _, n := range nodes {
		err := poll(ctx, timeout, n.Name+" annotations", func() (bool, error) {
			node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			a := node.Annotations
			for _, k := range []string{"kilo.squat.ai/key", "kilo.squat.ai/wireguard-ip", "kilo.squat.ai/endpoint", "kilo.squat.ai/internal-ip", "kilo.squat.ai/last-seen"} {
				if a[k] == "" {
					return false, fmt.Errorf("%s missing", k)
				}
			}
			return true, nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func metrics(ctx context.Context, c *http.Client, n *Node) (string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.IP+":1107/metrics", nil)
	resp, err := c.Do(req)
	if err != nil {
		return "", fmt.Errorf("%s metrics: %w", n.Name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

var handshakeRE = regexp.MustCompile(`(?m)^meshlet_peer_last_handshake_timestamp_seconds\{([^}]*)\} (\S+)$`)

// handshake is n's last handshake with peer, from its metrics.
func handshake(ctx context.Context, c *http.Client, n *Node, peer string) (time.Time, error) {
	var ts time.Time
	err := poll(ctx, 30*time.Second, n.Name+" handshake with "+peer, func() (bool, error) {
		m, err := metrics(ctx, c, n)
		if err != nil {
			return false, err
		}
		for _, mm := range handshakeRE.FindAllStringSubmatch(m, -1) {
			if strings.Contains(mm[1], `peer="`+peer+`"`) {
				f, err := strconv.ParseFloat(mm[2], 64)
				if err != nil {
					return false, err
				}
				ts = time.Unix(int64(f), 0)
				return true, nil
			}
		}
		return false, fmt.Errorf("no handshake series for %s", peer)
	})
	return ts, err
}

// killAgent SIGKILLs the `meshlet run` process on n (not the sidecar's
// `meshlet wireguard-userspace`), as a crash would.
func killAgent(n *Node) error {
	out, err := exec.Command("ip", "netns", "pids", n.NS).Output()
	if err != nil {
		return err
	}
	for _, f := range strings.Fields(string(out)) {
		cmd, _ := os.ReadFile("/proc/" + f + "/cmdline")
		args := strings.Split(string(cmd), "\x00")
		if len(args) > 1 && strings.HasSuffix(args[0], "/meshlet") && args[1] == "run" {
			pid, _ := strconv.Atoi(f)
			return syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return fmt.Errorf("no meshlet run process in %s", n.NS)
}

func startPingPod(ctx context.Context, cs kubernetes.Interface, name, node string) (*corev1.Pod, error) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: "busybox", Image: registry + "/e2e/busybox:1", Args: []string{"1000000"}}}},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	var got *corev1.Pod
	err := poll(ctx, 2*time.Minute, "pod "+name+" Running", func() (bool, error) {
		p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got = p
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", fmt.Errorf("phase %s", p.Status.Phase)
	})
	return got, err
}

type pingResult struct {
	sent, received int
	seqs           []int
	interval       time.Duration
	raw            string
	err            error
}

var (
	replyRE   = regexp.MustCompile(`seq=(\d+) `)
	summaryRE = regexp.MustCompile(`(\d+) packets transmitted, (\d+) packets received`)
)

func parsePing(out string, interval time.Duration) pingResult {
	r := pingResult{raw: out, interval: interval}
	s := bufio.NewScanner(strings.NewReader(out))
	for s.Scan() {
		if m := replyRE.FindStringSubmatch(s.Text()); m != nil {
			n, _ := strconv.Atoi(m[1])
			r.seqs = append(r.seqs, n)
		}
		if m := summaryRE.FindStringSubmatch(s.Text()); m != nil {
			r.sent, _ = strconv.Atoi(m[1])
			r.received, _ = strconv.Atoi(m[2])
		}
	}
	return r
}

// gaps are runs of missing sequence numbers.
func (r pingResult) gaps() [][2]int {
	seen := map[int]bool{}
	for _, s := range r.seqs {
		seen[s] = true
	}
	var gaps [][2]int
	for i := 0; i < r.sent; i++ {
		if !seen[i] {
			j := i
			for j+1 < r.sent && !seen[j+1] {
				j++
			}
			gaps = append(gaps, [2]int{i, j})
			i = j
		}
	}
	return gaps
}

func (r pingResult) longestGap() time.Duration {
	var longest int
	for _, g := range r.gaps() {
		if n := g[1] - g[0] + 1; n > longest {
			longest = n
		}
	}
	return time.Duration(longest) * r.interval
}

func ping(ctx context.Context, lane *Lane, pod, ip string, count int, interval string) (pingResult, error) {
	out, err := lane.Kubectl(ctx, "exec", "-n", "default", pod, "--", "ping", "-c", strconv.Itoa(count), "-i", interval, "-W", "1", ip)
	iv, _ := time.ParseDuration(interval + "s")
	r := parsePing(out, iv)
	if r.sent == 0 {
		return r, fmt.Errorf("ping printed no summary: %v\n%s", err, out)
	}
	return r, nil
}

func pingAsync(ctx context.Context, lane *Lane, pod, ip string, count int, interval string) <-chan pingResult {
	ch := make(chan pingResult, 1)
	go func() {
		r, err := ping(ctx, lane, pod, ip, count, interval)
		r.err = err
		ch <- r
	}()
	return ch
}
