package netlinkx

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// routeEventRelevant: someone (or the kernel, e.g. because a link went down)
// removed one of meshlet's routes. Pure.
func routeEventRelevant(u netlink.RouteUpdate) bool {
	return u.Type == unix.RTM_DELROUTE && u.Protocol == Protocol
}

// linkEventRelevant: the WireGuard link was deleted or is down. A down link
// is signalled every time it changes; for a non-leader that wants it down the
// re-apply is a no-op. Pure.
func linkEventRelevant(u netlink.LinkUpdate, iface string) bool {
	if u.Link == nil || u.Link.Attrs().Name != iface {
		return false
	}
	return u.Header.Type == unix.RTM_DELLINK || u.Link.Attrs().Flags&net.FlagUp == 0
}

// addrEventRelevant: an address was removed from the WireGuard link. Pure.
func addrEventRelevant(u netlink.AddrUpdate, ifindex int) bool {
	return !u.NewAddr && ifindex > 0 && u.LinkIndex == ifindex
}

// Watch subscribes to route, link and address events in the Host's
// namespace and sends on the returned channel (capacity 1, coalescing) when
// state meshlet owns was changed underneath it: a meshlet route deleted,
// iface deleted or brought down, an address removed from iface. The agent
// re-applies on every signal. The channel is closed when ctx ends. If a
// subscription breaks (e.g. the socket buffer overflowed and events were
// lost) Watch signals once and subscribes again.
func (h *Host) Watch(ctx context.Context, iface string) (<-chan struct{}, error) {
	out := make(chan struct{}, 1)
	signal := func() {
		select {
		case out <- struct{}{}:
		default:
		}
	}
	sub, err := h.subscribe()
	if err != nil {
		return nil, err
	}
	h.events.Add(1) // what was read before is not covered by the count
	h.watched.Store(true)
	go func() {
		defer close(out)
		defer h.watched.Store(false)
		for {
			h.watchLoop(ctx, sub, iface, signal)
			sub.close()
			// Events may have been lost: nothing read before holds.
			h.watched.Store(false)
			h.events.Add(1)
			if ctx.Err() != nil {
				return
			}
			signal()
			for {
				select {
				case <-ctx.Done():
					return
				case <-h.clock.After(100 * time.Millisecond):
				}
				if sub, err = h.subscribe(); err == nil {
					h.events.Add(1)
					h.watched.Store(true)
					break
				}
				h.log.Warn("netlink resubscribe failed", "error", err)
			}
		}
	}()
	return out, nil
}

type subscription struct {
	done   chan struct{}
	routes chan netlink.RouteUpdate
	links  chan netlink.LinkUpdate
	addrs  chan netlink.AddrUpdate
}

func (s *subscription) close() { close(s.done) }

func (h *Host) subscribe() (*subscription, error) {
	s := &subscription{
		done:   make(chan struct{}),
		routes: make(chan netlink.RouteUpdate, 256),
		links:  make(chan netlink.LinkUpdate, 64),
		addrs:  make(chan netlink.AddrUpdate, 64),
	}
	var ns *netns.NsHandle
	if h.ns.IsOpen() {
		ns = &h.ns
	}
	onErr := func(err error) {
		// Closing done closes the sockets, which fails the pending
		// receive: that is shutdown, not an error worth a warning.
		select {
		case <-s.done:
			return
		default:
		}
		h.log.Warn("netlink subscription error", "error", err)
	}
	if err := netlink.RouteSubscribeWithOptions(s.routes, s.done, netlink.RouteSubscribeOptions{Namespace: ns, ErrorCallback: onErr}); err != nil {
		close(s.done)
		return nil, fmt.Errorf("netlinkx: subscribe to route events: %w", err)
	}
	if err := netlink.LinkSubscribeWithOptions(s.links, s.done, netlink.LinkSubscribeOptions{Namespace: ns, ErrorCallback: onErr}); err != nil {
		close(s.done)
		return nil, fmt.Errorf("netlinkx: subscribe to link events: %w", err)
	}
	if err := netlink.AddrSubscribeWithOptions(s.addrs, s.done, netlink.AddrSubscribeOptions{Namespace: ns, ErrorCallback: onErr}); err != nil {
		close(s.done)
		return nil, fmt.Errorf("netlinkx: subscribe to address events: %w", err)
	}
	return s, nil
}

// watchLoop returns when ctx ends or any subscription channel closes.
func (h *Host) watchLoop(ctx context.Context, s *subscription, iface string, signal func()) {
	ifindex := 0
	if l, err := h.nl.LinkByName(iface); err == nil {
		ifindex = l.Attrs().Index
	}
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-s.routes:
			if !ok {
				return
			}
			h.events.Add(1)
			if routeEventRelevant(u) {
				signal()
			}
		case u, ok := <-s.links:
			if !ok {
				return
			}
			h.events.Add(1)
			if u.Link != nil && u.Link.Attrs().Name == iface && u.Header.Type != unix.RTM_DELLINK {
				ifindex = u.Link.Attrs().Index // the link may have been recreated
			}
			if linkEventRelevant(u, iface) {
				signal()
			}
		case u, ok := <-s.addrs:
			if !ok {
				return
			}
			h.events.Add(1)
			if addrEventRelevant(u, ifindex) {
				signal()
			}
		}
	}
}
