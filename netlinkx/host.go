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
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/utils/clock"
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
	// Recheck: while Watch runs, an Apply of the spec the last one applied
	// reads the host again only after a netlink event or once this long
	// has passed since it last did (default 30 s, Kilo's resync period), for
	// what no event reports: iptables, policy rules, sysctls.
	Recheck time.Duration
	// Clock times Recheck and the watch's back-off before it subscribes
	// again (nil: the real clock; the agent passes its one clock).
	Clock clock.Clock
}

// DefaultRecheck is Options.Recheck's default.
const DefaultRecheck = 30 * time.Second

// Host acts on one network namespace. Apply and Cleanup are serialised;
// Watch and the read helpers may run concurrently with them.
type Host struct {
	nl  *netlink.Handle // safe for concurrent use (per-request socket lock)
	ns  netns.NsHandle  // -1 (netns.None) when acting in the current namespace
	log *slog.Logger

	applyMu sync.Mutex
	// applied is what the last successful Apply verified (nil: nothing,
	// or it failed since); see upToDate.
	applied *verified
	recheck time.Duration
	clock   clock.Clock

	// events counts the netlink events Watch received, any route, link or
	// address change in the namespace; watched says a subscription is live,
	// so that an unchanged count means an unchanged host.
	events  atomic.Uint64
	watched atomic.Bool

	iptMu sync.Mutex
	ipt   map[family]iptablesClient
	// absent: chains (absentKey) not wanted that a check of this process
	// found or left absent (EnsureFirewall).
	absent map[string]bool

	sysctlMu    sync.Mutex
	sysctlNoted map[string]string // sysctls left as the host has them, logged once
}

// New opens a Host. Close it when done.
func New(opts Options) (*Host, error) {
	h := &Host{ns: netns.None(), log: opts.Logger, recheck: opts.Recheck, clock: opts.Clock}
	if h.log == nil {
		h.log = slog.Default()
	}
	if h.recheck <= 0 {
		h.recheck = DefaultRecheck
	}
	if h.clock == nil {
		h.clock = clock.RealClock{}
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

// Events is the count of netlink events Watch received so far, and whether
// a subscription is live: while it is, an unchanged count means no route,
// link or address of the namespace changed, so what was read of them still
// holds (node.Facts keeps the host's addresses and default route so).
func (h *Host) Events() (uint64, bool) { return h.events.Load(), h.watched.Load() }

// verified is a spec the host was found or made to match: at the event
// count events, at the time at.
type verified struct {
	spec    Spec
	events  uint64
	watched bool // Watch ran: events counts every change since
	at      time.Time
}

// upToDate reports whether an Apply of spec can skip reading the host: the
// last one applied an equal spec without error, no netlink event came since
// (Watch running), and it was less than Recheck ago. Call with applyMu held.
func (h *Host) upToDate(spec Spec, events uint64, watched bool) bool {
	v := h.applied
	return v != nil && v.watched && watched && v.events == events && h.clock.Since(v.at) < h.recheck && equalSpec(v.spec, spec)
}

// equalSpec compares two specs, nil and empty slices alike. Pure.
func equalSpec(a, b Spec) bool {
	return a.Link.Name == b.Link.Name && a.Link.MTU == b.Link.MTU && a.Link.Up == b.Link.Up &&
		slices.Equal(a.Link.Addresses, b.Link.Addresses) && a.Tunnel == b.Tunnel &&
		slices.Equal(a.Routes, b.Routes) && slices.Equal(a.Rules, b.Rules) &&
		slices.Equal(a.Firewall.NAT.Sources, b.Firewall.NAT.Sources) &&
		slices.Equal(a.Firewall.NAT.Destinations, b.Firewall.NAT.Destinations) &&
		slices.Equal(a.Firewall.NAT.Exceptions, b.Firewall.NAT.Exceptions) &&
		slices.Equal(a.Firewall.Forward, b.Firewall.Forward)
}

// cloneSpec copies a spec's slices, so a caller's later edits cannot
// change what was verified. Pure.
func cloneSpec(s Spec) Spec {
	s.Link.Addresses = slices.Clone(s.Link.Addresses)
	s.Routes, s.Rules = slices.Clone(s.Routes), slices.Clone(s.Rules)
	s.Firewall.NAT.Sources = slices.Clone(s.Firewall.NAT.Sources)
	s.Firewall.NAT.Destinations = slices.Clone(s.Firewall.NAT.Destinations)
	s.Firewall.NAT.Exceptions = slices.Clone(s.Firewall.NAT.Exceptions)
	s.Firewall.Forward = slices.Clone(s.Firewall.Forward)
	return s
}
