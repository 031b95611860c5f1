package node

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// TestDualStackNodes: one dual-stack cluster on real kubelets
// (docs/dual-stack.md) — the controller manager allocates each node a pod
// CIDR of each family, containerd's CNI gives the pods an address of each,
// and this tree's chart installed with dualStackTransitCIDR meshes both:
// a pod on node1 reaches a pod on node2, each in its own location, in IPv4
// and in IPv6.
func TestDualStackNodes(t *testing.T) {
	cur := laneRelease(t)
	bins := Bins{K8s: env(t, "MESHLET_K8S_BIN"), Node: env(t, "MESHLET_NODE_BIN"), Tools: env(t, "MESHLET_TOOLS_BIN")}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "meshlet-e2e-dualstack-")
	if err != nil {
		t.Fatal(err)
	}
	lane := NewLane(dir, bins, t.Logf)
	lane.DualStack = true
	t.Cleanup(func() {
		lane.Teardown()
		if !t.Failed() {
			os.RemoveAll(dir)
		} else {
			t.Logf("logs kept in %s", dir)
		}
	})
	step := func(name string, fn func() error) {
		t.Helper()
		start := time.Now()
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Logf("RESULT dual-stack step %-34s %6.1fs", name, time.Since(start).Seconds())
	}
	step("network namespaces", func() error { return lane.Network(2) })
	step("pki", lane.PKI)
	step("control plane ready", func() error { return lane.ControlPlane(ctx) })
	cs := kubernetes.NewForConfigOrDie(lane.Config("admin"))
	step("images pushed", func() error { return pushImages(ctx, t, lane, cur.ImageTar, dir) })
	for _, n := range lane.Nodes() {
		step("kubelet "+n.Name+" Ready, pod CIDRs of both families", func() error {
			if err := lane.StartNode(ctx, n, "meshlet.io/agent=true"); err != nil {
				return err
			}
			if err := waitNodeReady(ctx, cs, n.Name, 2*time.Minute); err != nil {
				return err
			}
			node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(node.Spec.PodCIDRs) != 2 {
				return fmt.Errorf("pod CIDRs %v, want one of each family (the controller manager's node IPAM)", node.Spec.PodCIDRs)
			}
			t.Logf("RESULT %s: pod CIDRs %v allocated by kube-controller-manager, addresses %v", n.Name, node.Spec.PodCIDRs, node.Status.Addresses)
			// A location per node and its endpoint, as a user annotates them.
			patch := fmt.Sprintf(`{"metadata":{"annotations":{"kilo.squat.ai/location":"loc-%d","kilo.squat.ai/force-endpoint":"%s:51820"}}}`, n.Index, n.IP)
			_, err = cs.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
			return err
		})
	}
	root := repoRoot(t)
	step("helm install with dualStackTransitCIDR", func() error {
		for _, k := range []string{"crds", "namespace"} {
			if _, err := lane.Kubectl(ctx, "apply", "--server-side", "-k", root+"/manifests/"+k); err != nil {
				return err
			}
		}
		_, err := lane.Helm(ctx, "install", "meshlet", cur.ChartTgz, "--namespace", kiloNS,
			"--set", "image.tag=e2e1", "--set", "wireguard.sidecar=true", "--set", "compatibility=",
			"--set", "apiServer.host="+cpIP, "--set", "apiServer.port="+strconv.Itoa(apiPort),
			"--set", "dualStackTransitCIDR=fd4b::/64")
		return err
	})
	step("meshlet pods Ready", func() error {
		_, err := waitDaemonSetPods(ctx, cs, "e2e1", 2, 3*time.Minute)
		return err
	})
	step("both families published", func() error {
		for _, n := range lane.Nodes() {
			err := poll(ctx, time.Minute, n.Name+"'s dual-stack annotations", func() (bool, error) {
				node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				a := node.Annotations
				ok := a["meshlet.io/dual-stack-internal-ip"] == n.IP6+"/64" && a["meshlet.io/dual-stack-wireguard-ip"] != "" && a["kilo.squat.ai/wireguard-ip"] != ""
				return ok, fmt.Errorf("internal-ip %q, dual-stack-internal-ip %q, wireguard-ip %q, dual-stack-wireguard-ip %q", a["kilo.squat.ai/internal-ip"],
					a["meshlet.io/dual-stack-internal-ip"], a["kilo.squat.ai/wireguard-ip"], a["meshlet.io/dual-stack-wireguard-ip"])
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	var pinger, target *corev1.Pod
	step("ping pods Running with an address of each family", func() error {
		var err error
		if pinger, err = startPingPod(ctx, cs, "pinger", lane.Nodes()[0].Name); err != nil {
			return err
		}
		if target, err = startPingPod(ctx, cs, "target", lane.Nodes()[1].Name); err != nil {
			return err
		}
		if len(target.Status.PodIPs) != 2 {
			return fmt.Errorf("target's pod IPs %v, want one of each family", target.Status.PodIPs)
		}
		return nil
	})
	for _, ip := range target.Status.PodIPs {
		family := "IPv4"
		if netip.MustParseAddr(ip.IP).Is6() {
			family = "IPv6"
		}
		step("pod to pod across the mesh, "+family, func() error {
			// Through the mesh, not the underlay: node1 routes the
			// address into kilo0.
			if out, err := exec.CommandContext(ctx, "ip", "-n", lane.Nodes()[0].NS, "route", "get", ip.IP).CombinedOutput(); err != nil || !strings.Contains(string(out), "dev kilo0") {
				return fmt.Errorf("node1's route to %s is not through kilo0: %v %s", ip.IP, err, out)
			}
			var res pingResult
			err := poll(ctx, time.Minute, "a reply from "+ip.IP, func() (bool, error) {
				var err error
				res, err = ping(ctx, lane, pinger.Name, ip.IP, 3, "0.2")
				return err == nil && res.received > 0, err
			})
			if err != nil {
				return fmt.Errorf("%w: %s", err, strings.TrimSpace(res.raw))
			}
			t.Logf("RESULT dual-stack ping %s -> %s(%s) %s: %d/%d", pinger.Spec.NodeName, target.Spec.NodeName, ip.IP, family, res.received, res.sent)
			return nil
		})
	}
}
