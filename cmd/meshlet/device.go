package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

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
func ensureDevice(ctx context.Context, iface, mode, userspaceDevice string, log *slog.Logger) (*wg.Device, error) {
	cfg := wg.DeviceConfig{Name: iface, Mode: wg.Mode(mode), Logger: log}
	if userspaceDevice == userspaceSidecar {
		cfg.WaitExternal = sidecarWait
	} else {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("finding meshlet's own binary: %w", err)
		}
		cfg.Spawn = []string{self, userspaceCommand, "--interface", iface}
	}
	return wg.EnsureDevice(ctx, cfg)
}

// newUserspaceDeviceCmd hosts a userspace WireGuard device until SIGTERM:
// the detached process `meshlet run` starts, or a sidecar container.
func newUserspaceDeviceCmd() *cobra.Command {
	var iface string
	c := &cobra.Command{
		Use:    userspaceCommand,
		Short:  "Host a userspace WireGuard device (started by meshlet run, or as a sidecar)",
		Hidden: true,
		Args:   noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			log := newLogger("info").With("interface", iface)
			d, err := wg.EnsureDevice(c.Context(), wg.DeviceConfig{Name: iface, Mode: wg.ModeUserspace, Logger: log})
			if err != nil {
				return err
			}
			select {
			case <-c.Context().Done():
				// SIGTERM: `meshlet cleanup` is removing the device.
				return d.Close()
			case <-d.Done():
				return errors.New("device stopped")
			}
		},
	}
	c.Flags().StringVar(&iface, "interface", "kilo0", "interface name")
	return c
}
