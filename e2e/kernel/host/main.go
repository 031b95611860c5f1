// Command host is the host side of the kernel lane's agent mode
// (hack/kernel/run.sh): a real etcd + kube-apiserver on the host's
// loopback, holding the scenario's three Node objects, that the meshlet
// agents inside the QEMU guest reach over QEMU user networking
// (10.0.2.2:PORT in the guest is 127.0.0.1:PORT here).
//
// Subcommands:
//
//	serve DIR   start the API server, apply meshlet's manifests, create the
//	            Nodes, write into DIR what run.sh packs into the initramfs
//	            (meshlet.kubeconfig, api-port, keys/NODE) plus
//	            admin.kubeconfig, then the file "ready"; run until SIGTERM
//	            or SIGINT and stop the API server.
//	check DIR   read the Nodes through admin.kubeconfig and check what the
//	            agents published; one "PASS <step>" or "FAIL <step>: why"
//	            line per step.
//	steps       the names of check's steps, one a line.
package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/apiserver"
)

// guestServer is the API address every node's kubeconfig names: the guest
// runner listens on 127.0.0.1:6443 inside each node's namespace and
// forwards to 10.0.2.2:PORT. The serving certificate's SANs include
// 127.0.0.1 (the port is not part of the check), so the CA verifies.
const guestServer = "https://127.0.0.1:6443"

// namespace is meshlet's namespace (manifests/namespace/namespace.yaml).
const namespace = "kilo-system"

// node is one scenario node as the API knows it. It mirrors
// e2e/kernel/guest/scenario.go (the guest builds the same nodes as
// namespaces); keep them in sync.
type node struct {
	name, location      string
	private             netip.Prefix // InternalIP with its subnet
	public              netip.Addr   // WireGuard endpoint address
	ciliumHost, podCIDR netip.Prefix
	leader              bool // the segment leader the scenario expects
	// private6 and podCIDR6: the node's IPv6 (a dual-stack cluster).
	private6, podCIDR6 netip.Prefix
}

var nodes = []node{
	{"leader", "a", netip.MustParsePrefix("192.168.1.10/24"), netip.MustParseAddr("198.51.100.10"),
		netip.MustParsePrefix("10.244.0.1/32"), netip.MustParsePrefix("10.244.0.0/24"), true,
		netip.MustParsePrefix("fd00:a::10/64"), netip.MustParsePrefix("fd10:244::/64")},
	{"worker", "a", netip.MustParsePrefix("192.168.1.11/24"), netip.MustParseAddr("198.51.100.11"),
		netip.MustParsePrefix("10.244.1.1/32"), netip.MustParsePrefix("10.244.1.0/24"), false,
		netip.MustParsePrefix("fd00:a::11/64"), netip.MustParsePrefix("fd10:244:0:1::/64")},
	{"remote", "b", netip.MustParsePrefix("192.168.2.20/24"), netip.MustParseAddr("198.51.100.20"),
		netip.MustParsePrefix("10.244.2.1/32"), netip.MustParsePrefix("10.244.2.0/24"), true,
		netip.MustParsePrefix("fd00:b::20/64"), netip.MustParsePrefix("fd10:244:0:2::/64")},
}

var steps = []string{"host-node-annotations", "host-wireguard-ip-leaders-only"}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "serve":
		if len(os.Args) != 3 {
			usage()
		}
		err = serve(os.Args[2])
	case "check":
		if len(os.Args) != 3 {
			usage()
		}
		os.Exit(check(os.Args[2]))
	case "steps":
		for _, s := range steps {
			fmt.Println(s)
		}
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kernel-host:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: kernel-host serve DIR | check DIR | steps")
	os.Exit(2)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kernel-host: "+format+"\n", args...)
}

// repoRoot finds the repository (manifests/) from this source file, or
// from $MESHLET_REPO.
func repoRoot() string {
	if r := os.Getenv("MESHLET_REPO"); r != "" {
		return r
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

func serve(dir string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	t0 := time.Now()
	srv, err := apiserver.StartServer(apiserver.Options{}, logf)
	if err != nil {
		return err
	}
	defer srv.Close()
	if err := setup(ctx, srv, dir); err != nil {
		return err
	}
	logf("API server %s ready with manifests and nodes in %.1fs", srv.URL(), time.Since(t0).Seconds())
	if err := os.WriteFile(filepath.Join(dir, "ready"), []byte(srv.URL()+"\n"), 0o644); err != nil {
		return err
	}
	<-ctx.Done()
	logf("stopping the API server")
	return nil
}

func setup(ctx context.Context, srv *apiserver.Server, dir string) error {
	admin := srv.AdminConfig()
	root := repoRoot()
	for _, f := range []string{"manifests/namespace/namespace.yaml", "manifests/crds/peers.kilo.squat.ai.yaml",
		"manifests/crds/clustermeshes.kilo.squat.ai.yaml", "manifests/base/rbac.yaml"} {
		if _, err := apiserver.ApplyFile(ctx, admin, filepath.Join(root, f), apiserver.ApplyOptions{}); err != nil {
			return fmt.Errorf("applying %s: %w", f, err)
		}
	}
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if err := createNode(ctx, cs, n); err != nil {
			return err
		}
	}
	// meshlet's ServiceAccount (manifests/base/rbac.yaml), as a DaemonSet pod
	// would use it, addressed at the in-guest forwarder.
	tok, err := srv.ServiceAccountToken(ctx, namespace, "meshlet")
	if err != nil {
		return err
	}
	guest := srv.TokenConfig(tok)
	guest.Host = guestServer
	if err := apiserver.WriteKubeconfig(filepath.Join(dir, "meshlet.kubeconfig"), guest); err != nil {
		return err
	}
	if err := apiserver.WriteKubeconfig(filepath.Join(dir, "admin.kubeconfig"), admin); err != nil {
		return err
	}
	u := srv.URL()
	if err := os.WriteFile(filepath.Join(dir, "api-port"), []byte(u[strings.LastIndex(u, ":")+1:]+"\n"), 0o644); err != nil {
		return err
	}
	// The nodes' WireGuard keys, made here so that check can compare the
	// published key annotations with them; the guest installs each as the
	// node's --key-file (meshlet loads an existing key file).
	if err := os.MkdirAll(filepath.Join(dir, "keys"), 0o700); err != nil {
		return err
	}
	for _, n := range nodes {
		k, err := wgtypes.GeneratePrivateKey()
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "keys", n.name), []byte(k.String()+"\n"), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// createNode creates a Node as a kubelet and Cozystack's machine config
// would leave it: pod CIDR, InternalIP, Ready, and the user annotation
// kilo.squat.ai/location. Everything else (key, endpoint, internal-ip,
// wireguard-ip, cni-compatibility-ip, last-seen, granularity) is meshlet's
// to publish.
func createNode(ctx context.Context, cs kubernetes.Interface, n node) error {
	obj := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.name,
			Labels:      map[string]string{"kubernetes.io/hostname": n.name},
			Annotations: map[string]string{topology.AnnotationLocation: n.location}},
		Spec: corev1.NodeSpec{PodCIDR: n.podCIDR.String(), PodCIDRs: []string{n.podCIDR.String(), n.podCIDR6.String()}},
	}
	created, err := cs.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating node %s: %w", n.name, err)
	}
	now := metav1.Now()
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.private.Addr().String()},
		{Type: corev1.NodeInternalIP, Address: n.private6.Addr().String()}, {Type: corev1.NodeHostName, Address: n.name}}
	created.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node %s status: %w", n.name, err)
	}
	return nil
}

// check is `host check DIR`.
func check(dir string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	failed := 0
	step := func(name string, fn func() error) {
		if err := fn(); err != nil {
			failed++
			fmt.Printf("FAIL %s: %s\n", name, strings.Join(strings.Fields(err.Error()), " "))
			return
		}
		fmt.Printf("PASS %s\n", name)
	}
	var got map[string]map[string]string
	load := func() error {
		cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "admin.kubeconfig"))
		if err != nil {
			return err
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return err
		}
		got = map[string]map[string]string{}
		for _, n := range nodes {
			obj, err := cs.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			got[n.name] = obj.Annotations
		}
		return nil
	}
	step("host-node-annotations", func() error {
		if err := load(); err != nil {
			return err
		}
		var errs []error
		for _, n := range nodes {
			errs = append(errs, checkAnnotations(dir, n, got[n.name]))
		}
		return errors.Join(errs...)
	})
	step("host-wireguard-ip-leaders-only", func() error {
		if got == nil {
			return errors.New("no nodes read")
		}
		subnet := netip.MustParsePrefix("10.4.0.0/16")
		// A location's leader is the node with the Lease's mark where one
		// carries it (location a ends led by worker: the guest's
		// leader-power-off-failover step), else the scenario's.
		marked := map[string]bool{}
		for _, n := range nodes {
			if got[n.name][topology.AnnotationLeader] != "" {
				marked[n.location] = true
			}
		}
		leads := func(n node) bool {
			if marked[n.location] {
				return got[n.name][topology.AnnotationLeader] != ""
			}
			return n.leader
		}
		seen := map[string]string{}
		var errs []error
		for _, n := range nodes {
			v, ok := got[n.name][topology.AnnotationWireGuardIP]
			switch {
			case !ok:
				errs = append(errs, fmt.Errorf("%s: no %s annotation", n.name, topology.AnnotationWireGuardIP))
			case !leads(n) && v != "":
				errs = append(errs, fmt.Errorf("%s (non-leader): wireguard-ip %q, want \"\"", n.name, v))
			case leads(n):
				p, err := netip.ParsePrefix(v)
				if err != nil || p.Bits() != subnet.Bits() || !subnet.Contains(p.Addr()) {
					errs = append(errs, fmt.Errorf("%s (leader): wireguard-ip %q, want an address of %s with its mask", n.name, v, subnet))
				} else if other, dup := seen[v]; dup {
					errs = append(errs, fmt.Errorf("%s and %s share wireguard-ip %s", other, n.name, v))
				}
				seen[v] = n.name
			}
		}
		if len(errs) == 0 {
			fmt.Printf("INFO wireguard-ip: leader %s, worker %q, remote %s\n", got["leader"][topology.AnnotationWireGuardIP],
				got["worker"][topology.AnnotationWireGuardIP], got["remote"][topology.AnnotationWireGuardIP])
		}
		return errors.Join(errs...)
	})
	if failed > 0 {
		return 1
	}
	return 0
}

// checkAnnotations: what meshlet on node n published about itself.
func checkAnnotations(dir string, n node, ann map[string]string) error {
	var errs []error
	want := func(key, v string) {
		if got, ok := ann[key]; !ok || got != v {
			errs = append(errs, fmt.Errorf("%s: %s = %q, want %q", n.name, key, got, v))
		}
	}
	kb, err := os.ReadFile(filepath.Join(dir, "keys", n.name))
	if err != nil {
		return err
	}
	k, err := wgtypes.ParseKey(strings.TrimSpace(string(kb)))
	if err != nil {
		return err
	}
	want(topology.AnnotationKey, k.PublicKey().String())
	want(topology.AnnotationEndpoint, netip.AddrPortFrom(n.public, 51820).String())
	want(topology.AnnotationInternalIP, n.private.String())
	want(topology.AnnotationDualStackInternalIP, n.private6.String())
	want(topology.AnnotationCNICompatibilityIP, n.ciliumHost.String())
	want(topology.AnnotationGranularity, "location")
	want(topology.AnnotationLocation, n.location)
	ls, ok := ann[topology.AnnotationLastSeen]
	if sec, err := strconv.ParseInt(ls, 10, 64); !ok || err != nil {
		errs = append(errs, fmt.Errorf("%s: last-seen %q is not unix seconds", n.name, ls))
	} else if age := time.Since(time.Unix(sec, 0)); age < -time.Minute || age > 10*time.Minute {
		errs = append(errs, fmt.Errorf("%s: last-seen %s is %s old", n.name, ls, age.Round(time.Second)))
	}
	return errors.Join(errs...)
}
