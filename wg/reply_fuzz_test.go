package wg

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// replyDevice is the name of the device replyLab serves.
const replyDevice = "fuzzwg0"

// replyLab serves a get=1 reply chosen per call as the userspace device
// replyDevice and reads it with wgctrl, the client meshlet uses: the
// reply is parsed by the code that parses a real device's. So that
// nothing is served in the machine's SocketDir (the agents and e2e runs
// of others use it), the socket lives in a private mount namespace of one
// OS thread, on which every read runs: a tmpfs over /run there, and
// nowhere else.
type replyLab struct {
	reqs chan replyReq
}

type replyReq struct {
	reply []byte
	res   chan replyRes
}

type replyRes struct {
	dev *wgtypes.Device
	err error
}

var (
	labOnce sync.Once
	lab     *replyLab
	labErr  error
)

func startReplyLab() (*replyLab, error) {
	labOnce.Do(func() {
		if os.Geteuid() != 0 {
			labErr = errors.New("needs root (a mount namespace)")
			return
		}
		l := &replyLab{reqs: make(chan replyReq)}
		ready := make(chan error)
		go l.run(ready)
		if labErr = <-ready; labErr == nil {
			lab = l
		}
	})
	return lab, labErr
}

// run never returns: its thread, locked and in its own mount namespace,
// is never given back to other goroutines.
func (l *replyLab) run(ready chan<- error) {
	runtime.LockOSThread()
	run, err := filepath.EvalSymlinks(filepath.Dir(SocketDir)) // /var/run -> /run
	if err == nil {
		err = unix.Unshare(unix.CLONE_NEWNS)
	}
	if err == nil {
		err = unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, "")
	}
	if err == nil {
		err = unix.Mount("tmpfs", run, "tmpfs", 0, "size=1m,mode=0755")
	}
	if err == nil {
		err = os.Mkdir(SocketDir, 0o700)
	}
	var ln *net.UnixListener
	if err == nil {
		ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(SocketDir, replyDevice+".sock"), Net: "unix"})
	}
	var client *wgctrl.Client
	if err == nil {
		client, err = wgctrl.New()
	}
	ready <- err
	if err != nil {
		select {} // keep the thread out of the scheduler's hands
	}
	for req := range l.reqs {
		served := make(chan struct{})
		go func() {
			defer close(served)
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			buf := make([]byte, len("get=1\n\n"))
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			_, _ = c.Write(req.reply)
		}()
		dev, err := client.Device(replyDevice)
		<-served
		req.res <- replyRes{dev, err}
	}
}

// read is the device wgctrl reads from reply.
func (l *replyLab) read(reply []byte) (*wgtypes.Device, error) {
	res := make(chan replyRes)
	l.reqs <- replyReq{reply, res}
	r := <-res
	return r.dev, r.err
}

// replySeeds are a real device's answers to get=1: wireguard-go's, after
// the configurations of uapiSeeds (what meshlet applies in the e2e runs),
// and hand-made ones for what a device answers rarely.
func replySeeds(f *testing.F) []string {
	var out []string
	for _, s := range uapiSeeds() {
		dev := newFuzzDevice()
		if op, ok := strings.CutPrefix(s, "set=1\n"); ok {
			_ = dev.IpcSet(op)
		}
		out = append(out, deviceConfigRaw(f, dev)+"errno=0\n\n")
		dev.Close()
	}
	k := strings.Repeat("01", 32)
	return append(out,
		"errno=1\n\n",
		"listen_port=51820\nfwmark=0\npublic_key="+k+"\nendpoint=[fe80::1%eth0]:51820\nlast_handshake_time_sec=1796111407\nlast_handshake_time_nsec=5\n"+
			"tx_bytes=100\nrx_bytes=200\npersistent_keepalive_interval=25\nprotocol_version=1\nallowed_ip=0.0.0.0/0\nallowed_ip=::/0\nerrno=0\n\n",
		"public_key="+k+"\npublic_key="+k+"\nallowed_ip=10.0.0.1/32\nerrno=0\n\n",
		"private_key=zz\nlisten_port=99999\n\n",
	)
}

func deviceConfigRaw(f *testing.F, dev interface{ IpcGet() (string, error) }) string {
	s, err := dev.IpcGet()
	if err != nil {
		f.Fatal(err)
	}
	return s
}

// replyDesired is what meshlet applies in the e2e runs: a remote leader
// (keepalive 25), a roaming Peer, a node peer without an endpoint.
func replyDesired() DiffInput {
	key := func(b byte) wgtypes.Key {
		var k wgtypes.Key
		for i := range k {
			k[i] = b
		}
		return k
	}
	pfx := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	peer := func(k byte, ep string, keep int, roaming bool, ips ...string) ResolvedPeer {
		p := ResolvedPeer{PeerSpec: PeerSpec{Name: "peer-" + string('a'+rune(k)), PublicKey: key(k), Endpoint: ep,
			PersistentKeepalive: time.Duration(keep) * time.Second, Roaming: roaming, AllowedIPs: pfx(ips...)}}
		if ep != "" {
			p.Addr = net.UDPAddrFromAddrPort(netip.MustParseAddrPort(ep))
		}
		return p
	}
	return DiffInput{PrivateKey: key(0xa8), ListenPort: 51820, Peers: []ResolvedPeer{
		peer(1, "198.51.100.7:51820", 25, false, "10.2.0.0/16", "100.66.1.1/32"),
		peer(2, "[2001:db8::2]:51821", 0, true, "10.5.0.1/32"),
		peer(3, "", 0, false, "10.1.1.0/24"),
	}}
}

// FuzzDeviceReply: a device's answer to get=1, parsed by wgctrl as meshlet
// reads its device, is refused or gives a device that meshlet's consumers
// take without panicking: StatsFromDevice (metrics, status) and Diff (the
// drift check and the apply). Diff converges: the configuration it
// computes, applied (fakeClient, as wireguard-go applies it), leaves
// nothing to change, whatever the device held before.
//
//	go test -run='^$' -fuzz='^FuzzDeviceReply$' -parallel=1 ./wg/
//
// It needs root (a private mount namespace for the socket); it skips
// without.
func FuzzDeviceReply(f *testing.F) {
	for _, s := range replySeeds(f) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, reply []byte) {
		l, err := startReplyLab()
		if err != nil {
			t.Skipf("no reply lab: %v", err)
		}
		dev, err := l.read(reply)
		if err != nil {
			return
		}
		if dev.Name != replyDevice {
			t.Fatalf("device %q", dev.Name)
		}
		st := StatsFromDevice(dev)
		if len(st.Peers) != len(dev.Peers) || !slices.IsSortedFunc(st.Peers, func(a, b PeerStats) int { return keyLess(a.PublicKey, b.PublicKey) }) {
			t.Fatalf("stats of %d peers: %d, sorted %v", len(dev.Peers), len(st.Peers), st.Peers)
		}
		in := replyDesired()
		cfg, _ := Diff(in, dev)
		keys := map[wgtypes.Key]bool{}
		for _, p := range dev.Peers {
			if keys[p.PublicKey] {
				return // no device lists a peer twice; converging is moot
			}
			keys[p.PublicKey] = true
		}
		fc := &fakeClient{dev: *dev}
		fc.dev.Peers = slices.Clone(dev.Peers)
		if err := fc.ConfigureDevice(replyDevice, cfg); err != nil {
			t.Fatal(err)
		}
		if _, rep := Diff(in, &fc.dev); rep.Changed() {
			t.Fatalf("Diff does not converge: after its config, still %+v", rep)
		}
	})
}

// TestReplyLab: the lab hands wgctrl a real device's reply (so that
// FuzzDeviceReply's seeds reach past the parser).
func TestReplyLab(t *testing.T) {
	l, err := startReplyLab()
	if err != nil {
		t.Skipf("no reply lab: %v", err)
	}
	dev := newFuzzDevice()
	defer dev.Close()
	op, _ := strings.CutPrefix(uapiSeeds()[1], "set=1\n")
	if err := dev.IpcSet(op); err != nil {
		t.Fatal(err)
	}
	reply, err := dev.IpcGet()
	if err != nil {
		t.Fatal(err)
	}
	d, err := l.read([]byte(reply + "errno=0\n\n"))
	if err == nil && len(d.Peers) == 2 && d.Peers[0].PublicKey[0] == 2 {
		d.Peers[0], d.Peers[1] = d.Peers[1], d.Peers[0] // the device lists peers in map order
	}
	if err != nil || d.ListenPort != 51820 || len(d.Peers) != 2 || len(d.Peers[0].AllowedIPs) != 2 || d.Peers[0].PersistentKeepaliveInterval != 25*time.Second {
		t.Fatalf("%+v %v", d, err)
	}
	if _, err := l.read([]byte("errno=1\n\n")); err == nil {
		t.Fatal("an errno reply read as a device")
	}
	if _, err := os.Stat(filepath.Join(SocketDir, replyDevice+".sock")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the lab's socket is visible outside its thread: %v", err)
	}
}
