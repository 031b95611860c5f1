package netlinkx

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ErrIPIPUnavailable means the plan needs an IPIP tunnel and the kernel
// cannot provide one (no ipip module). Routes through the tunnel cannot work;
// run Kilo/meshlet with --encapsulate=never or load the ipip module.
var ErrIPIPUnavailable = errors.New("IPIP tunnel needed but the kernel cannot create one (is the ipip module available?)")

// FindTunnel returns the first of names that exists as a link, else "".
func (h *Host) FindTunnel(names ...string) (string, error) {
	for _, name := range names {
		_, err := h.nl.LinkByName(name)
		if err == nil {
			return name, nil
		}
		if !errors.As(err, new(netlink.LinkNotFoundError)) {
			return "", fmt.Errorf("netlinkx: look up %s: %w", name, err)
		}
	}
	return "", nil
}

// EnsureTunnel makes sure the tunnel the plan routes through exists and is
// up, creating tunl0 only when the plan asks for it. It returns the device
// name ("" when the plan needs none).
func (h *Host) EnsureTunnel(ctx context.Context, t Tunnel) (string, error) {
	if t.Name == "" {
		return "", nil
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	link, err := h.nl.LinkByName(t.Name)
	if err != nil && !errors.As(err, new(netlink.LinkNotFoundError)) {
		return "", fmt.Errorf("netlinkx: look up tunnel %s: %w", t.Name, err)
	}
	if link == nil {
		if !t.Create {
			return "", fmt.Errorf("netlinkx: tunnel device %s: %w (and the plan does not ask to create it)", t.Name, ErrTunnelMissing)
		}
		// Adding an ipip link loads the module when it can; the module
		// then also creates its fallback device tunl0 itself, hence EEXIST
		// is fine when that is the one asked for.
		err := h.nl.LinkAdd(&netlink.Iptun{LinkAttrs: netlink.LinkAttrs{Name: t.Name}})
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return "", fmt.Errorf("netlinkx: create %s: %w: %w", t.Name, ErrIPIPUnavailable, err)
		}
		if link, err = h.nl.LinkByName(t.Name); err != nil {
			return "", fmt.Errorf("netlinkx: %s after creation: %w: %w", t.Name, ErrIPIPUnavailable, err)
		}
		h.log.Info("created IPIP tunnel", "device", t.Name)
	}
	if want := tunnelType(t.Name); link.Type() != want {
		return "", fmt.Errorf("netlinkx: tunnel device %s has link type %q, want %s", t.Name, link.Type(), want)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := h.nl.LinkSetUp(link); err != nil {
			return "", fmt.Errorf("netlinkx: set tunnel %s up: %w", t.Name, err)
		}
	}
	return t.Name, nil
}

// ErrTunnelMissing: the tunnel device the plan routes through does not
// exist and is not meshlet's to create (flannel.1, cilium_tunl).
var ErrTunnelMissing = errors.New("does not exist")

// tunnelType is the link type a tunnel device must have: flannel's is a
// VXLAN device, every other an IPIP tunnel.
func tunnelType(name string) string {
	if name == "flannel.1" {
		return "vxlan"
	}
	return "ipip"
}
