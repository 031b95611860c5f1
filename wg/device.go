package wg

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/ipc"
	"golang.zx2c4.com/wireguard/tun"
)

// Mode selects the WireGuard implementation (--wireguard).
type Mode string

const (
	// ModeAuto uses kernel WireGuard when the kernel has it, else userspace.
	ModeAuto Mode = "auto"
	// ModeKernel requires kernel WireGuard.
	ModeKernel Mode = "kernel"
	// ModeUserspace runs WireGuard inside this process (wireguard-go).
	ModeUserspace Mode = "userspace"
)

// Kind is the implementation a Device ended up with.
type Kind string

const (
	KindKernel Kind = "kernel"
	// KindUserspace is the in-process wireguard-go device.
	KindUserspace Kind = "userspace"
	// KindExternal is a userspace device run by someone else (e.g. the
	// wireguard-go daemon) that meshlet drives through its UAPI socket.
	KindExternal Kind = "external"
)

// SocketDir is where userspace WireGuard devices listen (fixed by wgctrl).
const SocketDir = "/var/run/wireguard"

// DefaultMTU is the MTU a new userspace TUN starts with; netlinkx sets the
// plan's MTU afterwards.
const DefaultMTU = 1420

// DeviceConfig says which device to ensure.
type DeviceConfig struct {
	Name string
	Mode Mode // "" = auto
	// NetNSPath creates/looks up a kernel device in another network
	// namespace (e.g. /run/netns/x); "" = this process's namespace. An
	// in-process userspace device is only possible in this process's
	// namespace.
	NetNSPath string
	// Spawn, when set, is the command line of a process that hosts the
	// userspace device (`meshlet wireguard-userspace --interface NAME`):
	// it is started detached, so the device and its sessions outlive a
	// restart of the caller, as a kernel device does. Empty: the device
	// runs in this process.
	Spawn []string
	// WaitExternal, when set, means someone else runs the userspace device
	// (a sidecar container sharing SocketDir): wait this long for its
	// socket instead of starting one.
	WaitExternal time.Duration
	Logger       *slog.Logger
}

// Device is an ensured WireGuard device. Close it on shutdown: for the
// in-process userspace device that stops it (its TUN disappears with it);
// a kernel device is left in place, deleting it is netlinkx Cleanup's job.
type Device struct {
	Name string
	Kind Kind
	// Created: EnsureDevice made it (a new kernel link, or a userspace
	// device it started), so a failed start removes it again.
	Created bool

	closeOnce sync.Once
	closeErr  error
	close     func() error
	done      <-chan struct{}
}

// Close stops an in-process userspace device; it is a no-op otherwise.
func (d *Device) Close() error {
	d.closeOnce.Do(func() {
		if d.close != nil {
			d.closeErr = d.close()
		}
	})
	return d.closeErr
}

// Done is closed when an in-process device stopped on its own (e.g. its TUN
// was deleted); nil for other kinds.
func (d *Device) Done() <-chan struct{} { return d.done }

// ErrKernelUnsupported means the kernel cannot create WireGuard links.
var ErrKernelUnsupported = errors.New("kernel WireGuard is not available")

// EnsureDevice makes sure the WireGuard device cfg.Name exists and can be
// driven through wgctrl, creating it when needed, with one rule: an existing
// device is used (a kernel link, or a TUN with a live UAPI socket, e.g. a
// sidecar's or a previous agent's); else a kernel device is created unless
// the mode is userspace; else (auto, userspace) a userspace device is
// waited for (cfg.WaitExternal: a sidecar's) or started, in a process of its
// own when cfg.Spawn is set. It runs in the
// caller's network namespace (the agent runs with hostNetwork).
func EnsureDevice(ctx context.Context, cfg DeviceConfig) (*Device, error) {
	if cfg.Name == "" {
		return nil, errors.New("wg: device name is required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	mode := cfg.Mode
	if mode == "" {
		mode = ModeAuto
	}
	switch mode {
	case ModeAuto, ModeKernel, ModeUserspace:
	default:
		return nil, fmt.Errorf("wg: unknown mode %q (want auto, kernel or userspace)", mode)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	nl, err := netlinkHandle(cfg.NetNSPath)
	if err != nil {
		return nil, err
	}
	defer nl.Close()

	if l, err := nl.LinkByName(cfg.Name); err == nil {
		switch l.Type() {
		case "wireguard":
			if mode == ModeUserspace {
				return nil, fmt.Errorf("wg: %s is a kernel WireGuard link but mode is userspace; delete it first", cfg.Name)
			}
			return &Device{Name: cfg.Name, Kind: KindKernel}, nil
		case "tun", "tuntap":
			// netlink reports a TUN as "tuntap" (its Tuntap type); "tun" is
			// what other tools call it.
			if mode != ModeKernel && socketLive(cfg.Name) {
				log.Info("using existing userspace WireGuard device", "interface", cfg.Name)
				return &Device{Name: cfg.Name, Kind: KindExternal}, nil
			}
			return nil, fmt.Errorf("wg: %s exists as a TUN without a live WireGuard socket in %s", cfg.Name, SocketDir)
		default:
			return nil, fmt.Errorf("wg: %s exists with link type %q, not WireGuard", cfg.Name, l.Type())
		}
	} else if !errors.As(err, new(netlink.LinkNotFoundError)) {
		return nil, fmt.Errorf("wg: look up link %s: %w", cfg.Name, err)
	}

	if mode != ModeUserspace {
		err := nl.LinkAdd(&netlink.Wireguard{LinkAttrs: netlink.LinkAttrs{Name: cfg.Name}})
		if err == nil {
			log.Info("created kernel WireGuard device", "interface", cfg.Name)
			return &Device{Name: cfg.Name, Kind: KindKernel, Created: true}, nil
		}
		if mode == ModeKernel {
			return nil, fmt.Errorf("wg: create kernel WireGuard link %s: %w: %w", cfg.Name, ErrKernelUnsupported, err)
		}
		if cfg.NetNSPath != "" {
			return nil, fmt.Errorf("wg: create kernel WireGuard link %s in %s: %w (and a userspace device cannot run in another namespace): %w",
				cfg.Name, cfg.NetNSPath, ErrKernelUnsupported, err)
		}
		log.Info("kernel WireGuard unavailable, using userspace", "interface", cfg.Name, "error", err)
	}
	if cfg.NetNSPath != "" {
		return nil, fmt.Errorf("wg: userspace device %s cannot run in namespace %s: run meshlet inside that namespace", cfg.Name, cfg.NetNSPath)
	}
	switch {
	case cfg.WaitExternal > 0:
		if err := waitSocket(ctx, cfg.Name, cfg.WaitExternal); err != nil {
			return nil, err
		}
		log.Info("using the userspace WireGuard device of the sidecar", "interface", cfg.Name)
		return &Device{Name: cfg.Name, Kind: KindExternal}, nil
	case len(cfg.Spawn) > 0:
		if err := spawnUserspace(ctx, cfg.Name, cfg.Spawn, log); err != nil {
			return nil, err
		}
		return &Device{Name: cfg.Name, Kind: KindExternal, Created: true}, nil
	}
	return startUserspace(cfg.Name, log)
}

func netlinkHandle(nsPath string) (*netlink.Handle, error) {
	if nsPath == "" {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return nil, fmt.Errorf("wg: open netlink handle: %w", err)
		}
		return h, nil
	}
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("wg: open network namespace %s: %w", nsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("wg: open netlink handle in %s: %w", nsPath, err)
	}
	return h, nil
}

func socketLive(name string) bool {
	c, err := net.DialTimeout("unix", filepath.Join(SocketDir, name+".sock"), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// startUserspace runs wireguard-go in this process, the way cmd/wireguard-go
// does: a TUN, the device, and a UAPI listener at SocketDir/<name>.sock so
// wgctrl drives it exactly like any other userspace device.
func startUserspace(name string, log *slog.Logger) (*Device, error) {
	tdev, err := tun.CreateTUN(name, DefaultMTU)
	if err != nil {
		return nil, fmt.Errorf("wg: create TUN %s: %w", name, err)
	}
	wlog := &device.Logger{
		Verbosef: func(format string, args ...any) {
			log.Debug(fmt.Sprintf(format, args...), "interface", name)
		},
		Errorf: func(format string, args ...any) {
			log.Warn(fmt.Sprintf(format, args...), "interface", name)
		},
	}
	dev := device.NewDevice(tdev, conn.NewDefaultBind(), wlog)
	uapiFile, err := ipc.UAPIOpen(name)
	if err != nil {
		dev.Close()
		return nil, fmt.Errorf("wg: open UAPI socket for %s: %w", name, err)
	}
	uapi, err := ipc.UAPIListen(name, uapiFile)
	if err != nil {
		uapiFile.Close()
		dev.Close()
		return nil, fmt.Errorf("wg: listen on UAPI socket for %s: %w", name, err)
	}
	// Without the change feed the agent reads the device periodically
	// instead (Manager.Watch): worse, not broken.
	feed, err := listenChanges(name)
	if err != nil {
		log.Warn("no change feed for the userspace device; the agent will poll it", "interface", name, "error", err)
	}
	go func() {
		for {
			c, err := uapi.Accept()
			if err != nil {
				return // listener closed
			}
			if feed != nil {
				c = newUAPIConn(c, feed.publish)
			}
			go dev.IpcHandle(c)
		}
	}()
	done := make(chan struct{})
	go func() {
		<-dev.Wait()
		close(done)
	}()
	log.Info("started userspace WireGuard device", "interface", name, "socket", filepath.Join(SocketDir, name+".sock"))
	return &Device{
		Name:    name,
		Kind:    KindUserspace,
		Created: true,
		done:    done,
		close: func() error {
			// UAPIListener.Close removes the socket file.
			err := uapi.Close()
			if feed != nil {
				if ferr := feed.close(); ferr != nil {
					log.Warn("closing the change feed", "interface", name, "error", ferr)
				}
			}
			dev.Close()
			if errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrNotExist) {
				err = nil
			}
			if err != nil {
				return fmt.Errorf("wg: close UAPI socket for %s: %w", name, err)
			}
			return nil
		},
	}, nil
}
