package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/meshlet/meshlet/wg"
)

// userspaceCommand runs a userspace WireGuard device as its own process.
// On a host, meshlet starts it detached (--userspace-device=child), so the
// device — and every session on it — outlives a restart of the agent, as a
// kernel device does. In a container every process dies with the container,
// so there the device runs in a container of its own (a sidecar sharing
// /var/run/wireguard, --userspace-device=sidecar): it outlives restarts of
// the agent's container, not the pod (manifests/README.md).
const userspaceCommand = "wireguard-userspace"

// Who runs a userspace device (--userspace-device).
const (
	userspaceChild   = "child"
	userspaceSidecar = "sidecar"
)

// sidecarWait bounds how long the agent waits for the sidecar's socket; past
// it the agent exits and its container is restarted.
const sidecarWait = 60 * time.Second

// ensureDevice returns the WireGuard device for mode: kernel when the
// kernel has it (auto, kernel), else a userspace device in its own
// long-lived process (auto, userspace): started here (child), or run by a
// sidecar container this waits for (sidecar).
func ensureDevice(ctx context.Context, iface, mode, userspaceDevice string, log *slog.Logger) (wg.Kind, error) {
	if mode == "" {
		mode = string(wg.ModeAuto)
	}
	if mode != string(wg.ModeUserspace) {
		d, err := wg.EnsureDevice(ctx, wg.DeviceConfig{Name: iface, Mode: wg.ModeKernel, Logger: log})
		if err == nil {
			return d.Kind, nil
		}
		if mode == string(wg.ModeKernel) || !errors.Is(err, wg.ErrKernelUnsupported) {
			// An existing userspace device in auto mode is fine.
			if d, err2 := wg.EnsureDevice(ctx, wg.DeviceConfig{Name: iface, Mode: wg.ModeUserspace, Logger: log}); mode == string(wg.ModeAuto) && err2 == nil && d.Kind == wg.KindExternal {
				return d.Kind, nil
			}
			return "", err
		}
		log.Info("kernel WireGuard unavailable, using a userspace device", "interface", iface)
	}
	if userspaceDevice == userspaceSidecar {
		if err := waitSocket(ctx, iface, sidecarWait); err != nil {
			return "", err
		}
		log.Info("userspace WireGuard device of the sidecar is up", "interface", iface)
	}
	if socketLive(iface) {
		d, err := wg.EnsureDevice(ctx, wg.DeviceConfig{Name: iface, Mode: wg.ModeUserspace, Logger: log})
		if err != nil {
			return "", err
		}
		return d.Kind, nil
	}
	if err := spawnUserspace(ctx, iface, log); err != nil {
		return "", err
	}
	d, err := wg.EnsureDevice(ctx, wg.DeviceConfig{Name: iface, Mode: wg.ModeUserspace, Logger: log})
	if err != nil {
		return "", err
	}
	return d.Kind, nil
}

func socketLive(iface string) bool {
	c, err := net.DialTimeout("unix", filepath.Join(wg.SocketDir, iface+".sock"), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// waitSocket polls for a live UAPI socket of iface until timeout.
func waitSocket(ctx context.Context, iface string, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !socketLive(iface) {
		select {
		case <-deadline.C:
			return fmt.Errorf("no userspace WireGuard device at %s within %s: is the wireguard sidecar running (meshlet %s --interface %s)?",
				filepath.Join(wg.SocketDir, iface+".sock"), timeout, userspaceCommand, iface)
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// pidFile records the userspace device's process for `meshlet cleanup`.
func pidFile(iface string) string { return filepath.Join(wg.SocketDir, iface+".meshlet.pid") }

func spawnUserspace(ctx context.Context, iface string, log *slog.Logger) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding meshlet's own binary: %w", err)
	}
	if err := os.MkdirAll(wg.SocketDir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", wg.SocketDir, err)
	}
	logf, err := os.OpenFile(filepath.Join(wg.SocketDir, iface+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening the userspace device log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(self, userspaceCommand, "--interface", iface)
	cmd.Stdout, cmd.Stderr = logf, logf
	// A session of its own: not killed with the agent's process group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the userspace WireGuard device: %w", err)
	}
	pid := cmd.Process.Pid
	_ = os.WriteFile(pidFile(iface), []byte(strconv.Itoa(pid)), 0o600)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	log.Info("started userspace WireGuard device process", "interface", iface, "pid", pid)
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !socketLive(iface) {
		select {
		case err := <-exited:
			return fmt.Errorf("userspace WireGuard device exited: %v (see %s)", err, logf.Name())
		case <-deadline.C:
			return errors.New("userspace WireGuard device did not open its socket within 10s")
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// runUserspaceDevice is the detached device process.
func runUserspaceDevice(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet(userspaceCommand, flag.ContinueOnError)
	iface := fs.String("interface", "kilo0", "interface name")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := newLogger("info").With("interface", *iface)
	d, err := wg.EnsureDevice(ctx, wg.DeviceConfig{Name: *iface, Mode: wg.ModeUserspace, Logger: log})
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		// SIGTERM: `meshlet cleanup` is removing the device.
		return d.Close()
	case <-d.Done():
		return errors.New("device stopped")
	}
}

// stopUserspace ends the detached device process, if meshlet started one.
func stopUserspace(iface string) error {
	b, err := os.ReadFile(pidFile(iface))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(string(b))
	if err != nil {
		return fmt.Errorf("bad pid file %s: %w", pidFile(iface), err)
	}
	if p, err := os.FindProcess(pid); err == nil {
		_ = p.Signal(syscall.SIGTERM)
	}
	return os.Remove(pidFile(iface))
}
