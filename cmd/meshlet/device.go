package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/meshlet/meshlet/wg"
)

// userspaceCommand runs a userspace WireGuard device as its own process.
// meshlet starts it detached, so the device — and every session on it —
// outlives a restart or upgrade of the agent, as a kernel device does.
const userspaceCommand = "wireguard-userspace"

// ensureDevice returns the WireGuard device for mode (wg.EnsureDevice's
// rule), a userspace one hosted by `meshlet wireguard-userspace`.
func ensureDevice(ctx context.Context, iface, mode string, log *slog.Logger) (wg.Kind, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding meshlet's own binary: %w", err)
	}
	d, err := wg.EnsureDevice(ctx, wg.DeviceConfig{Name: iface, Mode: wg.Mode(mode), Logger: log,
		Spawn: []string{self, userspaceCommand, "--interface", iface}})
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
