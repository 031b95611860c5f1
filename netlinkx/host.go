// Package netlinkx is meshlet's host network actuator: the WireGuard link's
// MTU, state and addresses, routes and policy rules, the IPIP tunnel device,
// the sysctls meshlet needs and its iptables chains. Every piece reads the
// current state, diffs it against the desired state with a pure function, and
// changes only the difference. Everything meshlet installs is tagged (routing
// protocol Protocol, chains named MESHLET-*) so it removes only its own.
//
// Every operation can target a network namespace (Options.NetNSPath): netlink
// calls use a handle opened in that namespace (netlink.NewHandleAt), and the
// few things that cannot take a handle — /proc/sys and the iptables binary
// that go-iptables executes — run on an OS thread locked and switched into
// the namespace for the duration of the call (see Host.do). A child process
// inherits the network namespace of the thread that forks it, so iptables
// runs inside the namespace without any wrapper binary.
package netlinkx

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Protocol is meshlet's routing protocol number (rtm_protocol), set on every
// route and rule meshlet installs so it can tell them from the kernel's,
// kg's or a CNI's. 109 (0x6d, 'm') is not assigned in iproute2's rt_protos
// (0–4 kernel, 8–18, 42 babel, 99 openr, 186–192 routing daemons). Add
// "109 meshlet" to /etc/iproute2/rt_protos.d/ to see the name in `ip route`.
const Protocol netlink.RouteProtocol = 109

// Options configure a Host.
type Options struct {
	// NetNSPath is the network namespace to act in, e.g. /run/netns/x;
	// "" means the namespace of the calling process.
	NetNSPath string
	Logger    *slog.Logger
}

// Host acts on one network namespace. Apply and Cleanup are serialised;
// Watch and the read helpers may run concurrently with them.
type Host struct {
	nl  *netlink.Handle // safe for concurrent use (per-request socket lock)
	ns  netns.NsHandle  // -1 (netns.None) when acting in the current namespace
	log *slog.Logger

	applyMu sync.Mutex

	iptMu sync.Mutex
	ipt   map[family]iptablesClient

	sysctlMu    sync.Mutex
	sysctlNoted map[string]string // sysctls left as the host has them, logged once
}

// New opens a Host. Close it when done.
func New(opts Options) (*Host, error) {
	h := &Host{ns: netns.None(), log: opts.Logger}
	if h.log == nil {
		h.log = slog.Default()
	}
	var err error
	if opts.NetNSPath == "" {
		h.nl, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	} else {
		h.ns, err = netns.GetFromPath(opts.NetNSPath)
		if err != nil {
			return nil, fmt.Errorf("netlinkx: open network namespace %s: %w", opts.NetNSPath, err)
		}
		h.nl, err = netlink.NewHandleAt(h.ns, unix.NETLINK_ROUTE)
	}
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("netlinkx: open netlink handle: %w", err)
	}
	return h, nil
}

// Close releases the netlink handle and the namespace handle.
func (h *Host) Close() error {
	if h.nl != nil {
		h.nl.Close()
	}
	if h.ns.IsOpen() {
		return h.ns.Close()
	}
	return nil
}

// do runs fn on an OS thread inside the Host's network namespace. Used for
// /proc/sys/net (resolved against the calling thread's namespace) and for
// executing iptables (a child inherits the forking thread's namespace). fn
// runs on a fresh goroutine locked to its thread: if switching back ever
// failed, that goroutine exits still locked and the runtime discards the
// thread, so no other goroutine can end up in the wrong namespace.
func (h *Host) do(fn func() error) error {
	if !h.ns.IsOpen() {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netlinkx: get current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(h.ns); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netlinkx: enter network namespace: %w", err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("netlinkx: return to original network namespace: %w", err))
			return // thread stays locked and is discarded
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
