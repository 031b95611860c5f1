package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
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

// ensureDevice returns the WireGuard device for mode (wg.EnsureDevice's
// rule); a userspace one is hosted by `meshlet wireguard-userspace`, started
// here (child) or run by a sidecar container (sidecar).
func ensureDevice(ctx context.Context, iface, mode, userspaceDevice string, log *slog.Logger) (wg.Kind, error) {
	cfg := wg.DeviceConfig{Name: iface, Mode: wg.Mode(mode), Logger: log}
	if userspaceDevice == userspaceSidecar {
		cfg.WaitExternal = sidecarWait
	} else {
		self, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("finding meshlet's own binary: %w", err)
		}
		cfg.Spawn = []string{self, userspaceCommand, "--interface", iface}
	}
	d, err := wg.EnsureDevice(ctx, cfg)
	if err != nil {
		return "", err
	}
	return d.Kind, nil
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
