package harness

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Router is a NAT router namespace: "wan" on the hub bridge, a "lan" bridge
// for the nodes behind it, nft masquerade, a forward policy that lets in
// only established/related traffic, and short UDP conntrack timeouts
// (docs/testing.md, "NAT") so an idle mapping expires in seconds. IPv6 is
// routed, not translated: a dual-stack node behind it has an address of
// the hub's IPv6 network, which the router answers for on the hub (proxy
// NDP) and forwards, both ways.
type Router struct {
	Name string
	NS   string
	WAN  netip.Prefix
	LAN  netip.Prefix
	env  *Env
	idx  int
	mu   sync.Mutex
	n    int
}

const natRules = `
table ip meshlet_e2e_nat {
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "wan" masquerade
	}
}
table inet meshlet_e2e_filter {
	chain forward {
		type filter hook forward priority filter; policy drop;
		ct state established,related accept
		iifname "lan" oifname "wan" accept
		# Between the nodes of the LAN: bridged, but seen here too where
		# br_netfilter is loaded (bridge-nf-call-iptables, a kernel-wide
		# module a container runtime loads).
		iifname "lan" oifname "lan" accept
		# IPv6 is routed, both ways.
		meta nfproto ipv6 accept
	}
}
`

// AddRouter creates a NAT router.
func (e *Env) AddRouter(ctx context.Context, name string) (*Router, error) {
	e.mu.Lock()
	e.routers++
	idx := e.routers
	e.mu.Unlock()
	r := &Router{Name: name, NS: e.id + "-" + name, env: e, idx: idx,
		LAN: netip.MustParsePrefix(fmt.Sprintf("192.168.%d.1/24", 100+idx))}
	if err := e.addNetns(r.NS); err != nil {
		return nil, err
	}
	r.WAN = e.nextHubAddr()
	if err := e.attachToHub(r.NS, "wan", r.WAN); err != nil {
		return nil, err
	}
	for _, args := range [][]string{
		{"link", "add", "lan", "type", "bridge"},
		{"addr", "add", r.LAN.String(), "dev", "lan"},
		{"addr", "add", "fe80::1/64", "dev", "lan", "nodad"},
		{"addr", "add", hubAddr6(r.WAN.Addr()).String(), "dev", "wan", "nodad"},
		{"link", "set", "lan", "up"},
	} {
		if err := ipn(ctx, r.NS, args...); err != nil {
			return nil, err
		}
	}
	if err := nftLoad(ctx, r.NS, natRules); err != nil {
		return nil, fmt.Errorf("router %s: %w", name, err)
	}
	// The conntrack sysctls exist once the ruleset above loaded conntrack.
	for k, v := range map[string]string{
		"net.ipv4.ip_forward":                           "1",
		"net.ipv6.conf.all.forwarding":                  "1",
		"net.ipv6.conf.wan.proxy_ndp":                   "1",
		"net.netfilter.nf_conntrack_udp_timeout":        "2",
		"net.netfilter.nf_conntrack_udp_timeout_stream": "4",
	} {
		if err := sysctl(ctx, r.NS, k, v); err != nil {
			return nil, fmt.Errorf("router %s: %w", name, err)
		}
	}
	return r, nil
}

// attach connects a node namespace to the router's LAN and returns its
// address; the node's default route points at the router, as DHCP would.
func (r *Router) attach(ctx context.Context, ns string) (netip.Prefix, error) {
	r.mu.Lock()
	r.n++
	idx := r.n
	r.mu.Unlock()
	a := r.LAN.Addr().As4()
	a[3] = byte(10 + idx)
	addr := netip.PrefixFrom(netip.AddrFrom4(a), r.LAN.Bits())
	end := "l" + strconv.Itoa(idx)
	for _, c := range []struct {
		ns   string
		args []string
	}{
		{r.NS, []string{"link", "add", end, "type", "veth", "peer", "name", "eth0", "netns", ns}},
		{r.NS, []string{"link", "set", end, "master", "lan", "up"}},
		{ns, []string{"addr", "add", addr.String(), "dev", "eth0"}},
		{ns, []string{"link", "set", "eth0", "up"}},
		{ns, []string{"route", "add", "default", "via", r.LAN.Addr().String()}},
	} {
		if err := ipn(ctx, c.ns, c.args...); err != nil {
			return netip.Prefix{}, err
		}
	}
	return addr, nil
}

// attach6 gives a node behind the router (attach first) a routed IPv6
// address of the hub's network, its IPv6 default route through the router.
func (r *Router) attach6(ctx context.Context, ns string) (netip.Prefix, error) {
	r.mu.Lock()
	idx := r.n
	r.mu.Unlock()
	a := HubNet6.Addr().As16()
	a[12], a[13], a[15] = 0xf0, byte(r.idx), byte(idx)
	addr := host(netip.AddrFrom16(a))
	for _, c := range []struct {
		ns   string
		args []string
	}{
		{ns, []string{"addr", "add", addr.String(), "dev", "eth0", "nodad"}},
		{ns, []string{"-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0"}},
		{r.NS, []string{"-6", "neigh", "add", "proxy", addr.Addr().String(), "dev", "wan"}},
		{r.NS, []string{"-6", "route", "add", addr.String(), "dev", "lan"}},
	} {
		if err := ipn(ctx, c.ns, c.args...); err != nil {
			return netip.Prefix{}, err
		}
	}
	return addr, nil
}

// FlushUDP deletes the router's UDP conntrack entries: every NAT mapping
// is forgotten at once, as if it had idled out.
func (r *Router) FlushUDP(ctx context.Context) error {
	_, err := nsExec(ctx, r.NS, "conntrack", "-D", "-p", "udp")
	if err != nil && strings.Contains(err.Error(), "0 flow entries") {
		return nil
	}
	return err
}

// UDPMappings lists the router's UDP conntrack entries (for the log).
func (r *Router) UDPMappings(ctx context.Context) string {
	out, _ := nsExec(ctx, r.NS, "conntrack", "-L", "-p", "udp")
	return strings.TrimSpace(out)
}

// PeerHost is the stand-in for a user's device behind a Kilo Peer object
// (a laptop): a namespace on the hub with a plain WireGuard device that the
// harness configures, as the user would from `kgctl showconf peer`.
type PeerHost struct {
	Name string
	NS   string
	IP   netip.Prefix // underlay
	// IP6 is its IPv6 underlay address, when it has an IPv6 mesh address.
	IP6  netip.Prefix
	Addr netip.Addr // its address inside the mesh (the Peer's allowedIPs)
	// Addrs are all its mesh addresses: Addr, then those of the other
	// family (a dual-stack laptop).
	Addrs   []netip.Addr
	Private string
	Public  string
	WGDir   string
	env     *Env
}

// PeerIface is the peer host's WireGuard interface.
const PeerIface = "wgp0"

// AddPeerHost creates a peer host with mesh address addr (and more, of the
// other family) and starts its WireGuard device (listening on 51820), with
// no peers yet. With an IPv6 mesh address it has an IPv6 underlay address
// too.
func (e *Env) AddPeerHost(ctx context.Context, name string, addr netip.Addr, more ...netip.Addr) (*PeerHost, error) {
	h := &PeerHost{Name: name, NS: e.id + "-" + name, Addr: addr, Addrs: append([]netip.Addr{addr}, more...), env: e}
	h.Private, h.Public = NewKeyPair()
	h.WGDir = filepath.Join(e.dir, "peers", name)
	if err := os.MkdirAll(h.WGDir, 0o755); err != nil {
		return nil, err
	}
	if err := e.addNetns(h.NS); err != nil {
		return nil, err
	}
	h.IP = e.nextHubAddr()
	if err := e.attachToHub(h.NS, "eth0", h.IP); err != nil {
		return nil, err
	}
	for _, a := range h.Addrs {
		if a.Is6() && !h.IP6.IsValid() {
			h.IP6 = hubAddr6(h.IP.Addr())
			if err := ipn(ctx, h.NS, "addr", "add", h.IP6.String(), "dev", "eth0", "nodad"); err != nil {
				return nil, err
			}
		}
	}
	if err := startDevice(ctx, e.opts.Meshlet, h.wrap, h.WGDir, PeerIface); err != nil {
		return nil, fmt.Errorf("peer host %s: %w", name, err)
	}
	if err := setUAPI(h.WGDir, PeerIface, "private_key="+HexKey(h.Private), "listen_port=51820"); err != nil {
		return nil, fmt.Errorf("peer host %s: %w", name, err)
	}
	for _, a := range h.Addrs {
		if err := ipn(ctx, h.NS, append([]string{"addr", "add", host(a).String(), "dev", PeerIface}, nodad(host(a))...)...); err != nil {
			return nil, err
		}
	}
	if err := ipn(ctx, h.NS, "link", "set", PeerIface, "up"); err != nil {
		return nil, err
	}
	return h, nil
}

// startDevice runs a userspace WireGuard device (meshlet's own, as the
// agent uses it) named iface through wrap, which puts it in its network and
// mount namespace, and waits for its UAPI socket in wgDir.
func startDevice(ctx context.Context, meshlet string, wrap func(...string) []string, wgDir, iface string) error {
	logf, err := os.Create(filepath.Join(wgDir, "device.log"))
	if err != nil {
		return err
	}
	w := wrap(meshlet, "wireguard-userspace", "--interface", iface)
	cmd := exec.Command(w[0], w[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	go func() { _ = cmd.Wait(); logf.Close() }()
	// Ready once the socket answers: its file exists from bind(2) on, a
	// moment before listen(2), when a connection is refused.
	sock := filepath.Join(wgDir, iface+".sock")
	return Poll(ctx, 10*time.Second, 20*time.Millisecond, "device socket "+sock, func() (bool, error) {
		c, err := net.Dial("unix", sock)
		if err != nil {
			return false, nil
		}
		return true, c.Close()
	})
}

func (h *PeerHost) wrap(args ...string) []string {
	return append([]string{"ip", "netns", "exec", h.NS, "sh", "-c",
		`mount --bind "$1" /run/wireguard && shift && exec "$@"`, "sh", h.WGDir}, args...)
}

// Exec runs a command on the peer host (its network and mount namespace).
func (h *PeerHost) Exec(ctx context.Context, args ...string) (string, error) {
	w := h.wrap(args...)
	return run(ctx, w[0], w[1:]...)
}

// SetPeer configures the laptop's one peer (the mesh), with endpoint ""
// for none, and routes nets through the tunnel.
func (h *PeerHost) SetPeer(ctx context.Context, pubKey, endpoint string, nets []netip.Prefix) error {
	lines := []string{"public_key=" + HexKey(pubKey), "replace_allowed_ips=true"}
	for _, p := range nets {
		lines = append(lines, "allowed_ip="+p.String())
	}
	if endpoint != "" {
		lines = append(lines, "endpoint="+endpoint)
	}
	if err := setUAPI(h.WGDir, PeerIface, lines...); err != nil {
		return fmt.Errorf("peer host %s: %w", h.Name, err)
	}
	for _, p := range nets {
		if err := ipn(ctx, h.NS, "route", "replace", p.String(), "dev", PeerIface, "src", h.addrFor(p.Addr()).String()); err != nil {
			return err
		}
	}
	return nil
}

// addrFor is the peer host's mesh address of dst's family.
func (h *PeerHost) addrFor(dst netip.Addr) netip.Addr {
	for _, a := range h.Addrs {
		if a.Is4() == dst.Is4() {
			return a
		}
	}
	return h.Addr
}

// MoveIPv6 gives the peer host a new IPv6 underlay address in place of the
// old one, as a laptop that changes networks does (it roams).
func (h *PeerHost) MoveIPv6(ctx context.Context, to netip.Prefix) error {
	if err := ipn(ctx, h.NS, "addr", "add", to.String(), "dev", "eth0", "nodad"); err != nil {
		return err
	}
	if err := ipn(ctx, h.NS, "addr", "del", h.IP6.String(), "dev", "eth0"); err != nil {
		return err
	}
	h.IP6 = to
	return nil
}

// Device reads the peer host's device.
func (h *PeerHost) Device() (*WGDevice, error) { return readUAPI(h.WGDir, PeerIface) }

// Reachable pings dst once from the laptop's mesh address.
func (h *PeerHost) Reachable(ctx context.Context, dst netip.Addr, wait time.Duration) bool {
	out, _ := exec.CommandContext(ctx, "ip", "netns", "exec", h.NS, "ping", "-n", "-q", "-c", "1",
		"-W", fmt.Sprintf("%.3f", wait.Seconds()), "-I", h.addrFor(dst).String(), dst.String()).CombinedOutput()
	m := pingStats.FindStringSubmatch(string(out))
	return m != nil && m[2] == "1"
}
