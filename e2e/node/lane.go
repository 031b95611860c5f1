// Package node is make e2e-node: real kubelets and containerd register
// Ready nodes to a real kube-apiserver (with kube-controller-manager and
// kube-scheduler), all in network namespaces this package creates, and
// meshlet is installed on them as a user installs it: its Helm chart, its
// image pulled from a registry. README.md has the recipe and the figures.
package node

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/meshlet/meshlet/e2e/apiserver"
)

// Addresses inside the lane's namespaces (never on the host's network).
const (
	cpIP        = "10.250.0.1"
	apiPort     = 6443
	registry    = cpIP + ":5000"
	podCIDRBase = "10.251." // node i gets 10.251.i.0/24
)

// Bins are the binaries the lane runs.
type Bins struct {
	K8s   string // kube-apiserver, kubectl, etcd (hack/k8s/ensure.sh)
	Node  string // kubelet, kube-controller-manager, kube-scheduler (ensure.sh node)
	Tools string // crane, helm (ensure.sh tools)
}

// Lane is one control plane namespace and its nodes.
type Lane struct {
	Dir    string
	Bins   Bins
	Prefix string // netns name prefix
	Logf   func(format string, args ...any)
	// DualStack makes the cluster dual-stack (docs/dual-stack.md): IPv6 on
	// the underlay, both families of service and cluster CIDRs, and the
	// controller manager allocating each node a pod CIDR of each family
	// (set before Network).
	DualStack bool

	cpNS   string
	tokens map[string]string
	procs  []*exec.Cmd
	nodes  []*Node
}

// Node is one kubelet + containerd in its own network namespace.
type Node struct {
	Name, NS, IP, PodCIDR string
	// IP6 is the node's IPv6 underlay address (a dual-stack lane).
	IP6   string
	Dir   string
	Index int
}

// The dual-stack lane's IPv6 underlay, service and cluster CIDRs.
const (
	cpIP6        = "fd00:250::1"
	serviceCIDRs = "10.0.0.0/24,fd00:10::/112"
	clusterCIDRs = "10.251.0.0/16,fd10:251::/56"
)

// NewLane makes the lane's directory; nothing runs yet.
func NewLane(dir string, bins Bins, logf func(string, ...any)) *Lane {
	return &Lane{Dir: dir, Bins: bins, Logf: logf, Prefix: fmt.Sprintf("mln%d", os.Getpid()%10000),
		tokens: map[string]string{}}
}

func (l *Lane) path(p ...string) string { return filepath.Join(append([]string{l.Dir}, p...)...) }

func run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Network creates the control plane namespace with bridge br0 and one
// namespace per node, each with eth0 on br0.
func (l *Lane) Network(nodes int) error {
	l.cpNS = l.Prefix + "-cp"
	cmds := [][]string{
		{"ip", "netns", "add", l.cpNS},
		{"ip", "-n", l.cpNS, "link", "set", "lo", "up"},
		{"ip", "-n", l.cpNS, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", l.cpNS, "addr", "add", cpIP + "/24", "dev", "br0"},
		{"ip", "-n", l.cpNS, "link", "set", "br0", "up"},
	}
	if l.DualStack {
		cmds = append(cmds, []string{"ip", "-n", l.cpNS, "addr", "add", cpIP6 + "/64", "dev", "br0", "nodad"})
	}
	for i := 1; i <= nodes; i++ {
		n := &Node{Index: i, Name: fmt.Sprintf("node%d", i), NS: fmt.Sprintf("%s-n%d", l.Prefix, i),
			IP: fmt.Sprintf("10.250.0.%d", 10+i), PodCIDR: fmt.Sprintf("%s%d.0/24", podCIDRBase, i), Dir: l.path(fmt.Sprintf("node%d", i))}
		l.nodes = append(l.nodes, n)
		veth := fmt.Sprintf("veth%d", i)
		cmds = append(cmds,
			[]string{"ip", "netns", "add", n.NS},
			// Made in the control plane's namespace with its peer moved
			// straight into the node's: nothing appears on the host.
			[]string{"ip", "-n", l.cpNS, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", n.NS},
			[]string{"ip", "-n", l.cpNS, "link", "set", veth, "master", "br0", "up"},
			[]string{"ip", "-n", n.NS, "addr", "add", n.IP + "/24", "dev", "eth0"},
			[]string{"ip", "-n", n.NS, "link", "set", "eth0", "up"},
			[]string{"ip", "-n", n.NS, "link", "set", "lo", "up"},
			[]string{"ip", "-n", n.NS, "route", "add", "default", "via", cpIP},
		)
		if l.DualStack {
			n.IP6 = fmt.Sprintf("fd00:250::%d", 10+i)
			cmds = append(cmds, []string{"ip", "-n", n.NS, "addr", "add", n.IP6 + "/64", "dev", "eth0", "nodad"},
				[]string{"ip", "-n", n.NS, "-6", "route", "add", "default", "via", cpIP6})
		}
	}
	for _, c := range cmds {
		if err := run(c...); err != nil {
			return err
		}
	}
	return nil
}

// Nodes are the lane's nodes.
func (l *Lane) Nodes() []*Node { return l.nodes }

// CPNS is the control plane's network namespace.
func (l *Lane) CPNS() string { return l.cpNS }

// start runs bin inside the control plane's namespace, in a session of its
// own, logging to name.log.
func (l *Lane) start(name, bin string, args ...string) error {
	logf, err := os.Create(l.path(name + ".log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command("ip", append([]string{"netns", "exec", l.cpNS, bin}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	l.procs = append(l.procs, cmd)
	go func() { _ = cmd.Wait() }()
	return nil
}

// PKI writes the CA, the API server's serving and kubelet-client
// certificates, the ServiceAccount key pair and the static tokens.
func (l *Lane) PKI() error {
	if err := os.MkdirAll(l.path("pki"), 0o700); err != nil {
		return err
	}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "meshlet-e2e-node-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, _ := x509.ParseCertificate(caDER)
	if err := writePEM(l.path("pki", "ca.crt"), "CERTIFICATE", caDER); err != nil {
		return err
	}
	issue := func(name string, tmpl *x509.Certificate) error {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(48*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			return err
		}
		kb, _ := x509.MarshalECPrivateKey(k)
		return errors.Join(writePEM(l.path("pki", name+".crt"), "CERTIFICATE", der), writePEM(l.path("pki", name+".key"), "EC PRIVATE KEY", kb))
	}
	// 10.250.0.1 is also where meshlet reaches it (chart value apiServer,
	// as a Talos node reaches KubePrism); 10.0.0.1 is the Service.
	if err := issue("apiserver", &x509.Certificate{Subject: pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP(cpIP), net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
		DNSNames:    []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}}); err != nil {
		return err
	}
	// O=system:masters: kubectl logs/exec through the kubelet's webhook.
	if err := issue("apiserver-kubelet-client", &x509.Certificate{Subject: pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return err
	}
	sa, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	saPriv, _ := x509.MarshalECPrivateKey(sa)
	saPub, _ := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err := errors.Join(writePEM(l.path("pki", "sa.key"), "EC PRIVATE KEY", saPriv), writePEM(l.path("pki", "sa.pub"), "PUBLIC KEY", saPub)); err != nil {
		return err
	}
	var csv strings.Builder
	add := func(user, groups string) {
		tok := randomHex(16)
		l.tokens[user] = tok
		fmt.Fprintf(&csv, "%s,%s,%s,\"%s\"\n", tok, user, user, groups)
	}
	add("admin", "system:masters")
	add("system:kube-controller-manager", "system:masters")
	add("system:kube-scheduler", "system:masters")
	for _, n := range l.nodes {
		add("system:node:"+n.Name, "system:nodes")
	}
	return os.WriteFile(l.path("pki", "tokens.csv"), []byte(csv.String()), 0o600)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}

// Config is a client config for user, dialing from inside the control
// plane's namespace (the test process stays in the host's).
func (l *Lane) Config(user string) *rest.Config {
	ca, _ := os.ReadFile(l.path("pki", "ca.crt"))
	return &rest.Config{Host: fmt.Sprintf("https://%s:%d", cpIP, apiPort), BearerToken: l.tokens[user],
		TLSClientConfig: rest.TLSClientConfig{CAData: ca}, Dial: NSDialer("/run/netns/" + l.cpNS), QPS: 50, Burst: 100}
}

// kubeconfig writes a kubeconfig for user (no dialer: it is for programs
// that run inside the namespaces).
func (l *Lane) kubeconfig(path, user string) error {
	cfg := l.Config(user)
	cfg.Dial = nil
	return apiserver.WriteKubeconfig(path, cfg)
}

// AdminKubeconfig is the admin's kubeconfig, for kubectl and helm run in the
// control plane's namespace.
func (l *Lane) AdminKubeconfig() string { return l.path("admin.kubeconfig") }

// inNetns runs fn on a goroutine whose thread is in the network namespace
// at nsPath: a socket fn makes stays in that namespace, and the thread,
// locked and never switched back, ends with the goroutine.
func inNetns[T any](nsPath string, fn func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		var zero T
		h, err := netns.GetFromPath(nsPath)
		if err != nil {
			ch <- result{zero, err}
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			ch <- result{zero, fmt.Errorf("entering %s: %w", nsPath, err)}
			return
		}
		v, err := fn()
		ch <- result{v, err}
	}()
	r := <-ch
	return r.v, r.err
}

// NSDialer dials from inside the network namespace at nsPath.
func NSDialer(nsPath string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return inNetns(nsPath, func() (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		})
	}
}

// KubePrism listens on 127.0.0.1:7445 in n's network namespace and carries
// each connection to the API server, as Talos's KubePrism (a TCP load
// balancer on the node's loopback) does for Cozystack's kubeconfig. TLS
// passes through: the API server's certificate names 127.0.0.1, as a
// Talos API server's does. It stops when ctx ends; the count is of the
// connections it carried.
func (l *Lane) KubePrism(ctx context.Context, n *Node) (*atomic.Int64, error) {
	ln, err := inNetns("/run/netns/"+n.NS, func() (net.Listener, error) {
		return net.Listen("tcp", "127.0.0.1:7445")
	})
	if err != nil {
		return nil, fmt.Errorf("KubePrism on %s: %w", n.Name, err)
	}
	dial := NSDialer("/run/netns/" + n.NS)
	var carried atomic.Int64
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := dial(ctx, "tcp", fmt.Sprintf("%s:%d", cpIP, apiPort))
				if err != nil {
					return
				}
				defer up.Close()
				carried.Add(1)
				done := make(chan struct{}, 2)
				pipe := func(dst, src net.Conn) {
					_, _ = io.Copy(dst, src)
					if tc, ok := dst.(*net.TCPConn); ok {
						_ = tc.CloseWrite()
					}
					done <- struct{}{}
				}
				go pipe(up, c)
				go pipe(c, up)
				select {
				case <-done:
					<-done
				case <-ctx.Done():
				}
			}()
		}
	}()
	return &carried, nil
}

// serviceCIDRs is the API server's --service-cluster-ip-range.
func (l *Lane) serviceCIDRs() string {
	if l.DualStack {
		return serviceCIDRs
	}
	return "10.0.0.0/24"
}

// ControlPlane starts etcd, kube-apiserver (Pod Security baseline enforced
// outside kube-system, as Talos does), kube-controller-manager,
// kube-scheduler and a registry, and waits for the API server.
func (l *Lane) ControlPlane(ctx context.Context) error {
	k, nb := l.Bins.K8s, l.Bins.Node
	if err := l.start("etcd", filepath.Join(k, "etcd"), "--name=default", "--data-dir="+l.path("etcd"),
		"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=default=http://127.0.0.1:2380", "--unsafe-no-fsync", "--log-level=warn"); err != nil {
		return err
	}
	if err := os.WriteFile(l.path("admission.yaml"), []byte(apiserver.PodSecurityBaseline), 0o600); err != nil {
		return err
	}
	p := func(n string) string { return l.path("pki", n) }
	if err := l.start("kube-apiserver", filepath.Join(k, "kube-apiserver"),
		"--bind-address="+cpIP, "--advertise-address="+cpIP, "--secure-port="+strconv.Itoa(apiPort),
		"--etcd-servers=http://127.0.0.1:2379",
		"--tls-cert-file="+p("apiserver.crt"), "--tls-private-key-file="+p("apiserver.key"), "--client-ca-file="+p("ca.crt"),
		"--token-auth-file="+p("tokens.csv"), "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--admission-control-config-file="+l.path("admission.yaml"),
		"--service-account-key-file="+p("sa.pub"), "--service-account-signing-key-file="+p("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc", "--service-cluster-ip-range="+l.serviceCIDRs(),
		"--kubelet-client-certificate="+p("apiserver-kubelet-client.crt"), "--kubelet-client-key="+p("apiserver-kubelet-client.key"),
		// Else kubectl logs/exec dial the node by name, which resolves nowhere.
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--allow-privileged=true", "--enable-priority-and-fairness=false", "--profiling=false", "--v=1"); err != nil {
		return err
	}
	if err := l.kubeconfig(l.AdminKubeconfig(), "admin"); err != nil {
		return err
	}
	if err := waitReady(ctx, l.Config("admin"), "/readyz", 90*time.Second); err != nil {
		return fmt.Errorf("kube-apiserver: %w\n%s", err, tailFile(l.path("kube-apiserver.log"), 20))
	}
	for _, c := range []struct{ name, user string }{{"kcm", "system:kube-controller-manager"}, {"scheduler", "system:kube-scheduler"}} {
		if err := l.kubeconfig(l.path(c.name+".kubeconfig"), c.user); err != nil {
			return err
		}
	}
	kcm := []string{"--kubeconfig=" + l.path("kcm.kubeconfig"), "--service-account-private-key-file=" + p("sa.key"),
		"--root-ca-file=" + p("ca.crt"), "--leader-elect=false", "--use-service-account-credentials=false",
		"--bind-address=127.0.0.1", "--v=1"}
	if l.DualStack {
		// Node IPAM: a pod CIDR of each family per node, as kubeadm's
		// dual-stack clusters have them.
		kcm = append(kcm, "--allocate-node-cidrs=true", "--cluster-cidr="+clusterCIDRs, "--node-cidr-mask-size-ipv4=24",
			"--node-cidr-mask-size-ipv6=64", "--service-cluster-ip-range="+serviceCIDRs)
	}
	if err := l.start("kube-controller-manager", filepath.Join(nb, "kube-controller-manager"), kcm...); err != nil {
		return err
	}
	if err := l.start("kube-scheduler", filepath.Join(nb, "kube-scheduler"),
		"--kubeconfig="+l.path("scheduler.kubeconfig"), "--leader-elect=false", "--bind-address=127.0.0.1", "--v=1"); err != nil {
		return err
	}
	if err := os.MkdirAll(l.path("registry"), 0o755); err != nil {
		return err
	}
	if err := l.start("registry", filepath.Join(l.Bins.Tools, "crane"), "registry", "serve", "--address="+registry, "--disk="+l.path("registry")); err != nil {
		return err
	}
	dial := NSDialer("/run/netns/" + l.cpNS)
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := dial(ctx, "tcp", registry)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("registry not listening on %s: %w\n%s", registry, err, tailFile(l.path("registry.log"), 10))
		}
		time.Sleep(50 * time.Millisecond) // polling for the listener, bounded by the deadline
	}
}

func waitReady(ctx context.Context, cfg *rest.Config, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	rc := cs.Discovery().RESTClient()
	var last error
	for {
		if _, last = rc.Get().AbsPath(path).DoRaw(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w", path, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		lines = append(lines, s.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// InNS runs a command in the control plane's namespace (kubectl, helm,
// crane reach the API server and the registry there).
func (l *Lane) InNS(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", l.cpNS}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+l.AdminKubeconfig(),
		"HELM_CACHE_HOME="+l.path("helm", "cache"), "HELM_CONFIG_HOME="+l.path("helm", "config"), "HELM_DATA_HOME="+l.path("helm", "data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Kubectl runs the lane's kubectl as the admin.
func (l *Lane) Kubectl(ctx context.Context, args ...string) (string, error) {
	return l.InNS(ctx, append([]string{filepath.Join(l.Bins.K8s, "kubectl")}, args...)...)
}

// Helm runs helm of hack/tools as the admin.
func (l *Lane) Helm(ctx context.Context, args ...string) (string, error) {
	return l.InNS(ctx, append([]string{filepath.Join(l.Bins.Tools, "helm")}, args...)...)
}

// Crane runs crane against the lane's registry (plain HTTP).
func (l *Lane) Crane(ctx context.Context, args ...string) (string, error) {
	return l.InNS(ctx, append([]string{filepath.Join(l.Bins.Tools, "crane"), "--insecure"}, args...)...)
}

// Registry is the registry's address as nodes reach it.
func (l *Lane) Registry() string { return registry }

// Teardown stops every process of the lane (nodes first), then deletes the
// namespaces and the nodes' cgroups.
func (l *Lane) Teardown() {
	for _, n := range l.nodes {
		n.stop(l)
	}
	for i := len(l.procs) - 1; i >= 0; i-- {
		if p := l.procs[i].Process; p != nil {
			_ = p.Signal(syscall.SIGKILL)
		}
	}
	for _, n := range l.nodes {
		_ = run("ip", "netns", "del", n.NS)
	}
	if l.cpNS != "" {
		_ = run("ip", "netns", "del", l.cpNS)
	}
}
