package wg

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// pidFile records a spawned userspace device's process, for StopSpawned.
func pidFile(iface string) string { return filepath.Join(SocketDir, iface+".meshlet.pid") }

// spawnUserspace starts argv detached (a session of its own, not killed
// with the caller's process group) and waits until the device's UAPI socket
// answers.
func spawnUserspace(ctx context.Context, iface string, argv []string, log *slog.Logger) error {
	if err := os.MkdirAll(SocketDir, 0o755); err != nil {
		return fmt.Errorf("wg: creating %s: %w", SocketDir, err)
	}
	logf, err := os.OpenFile(filepath.Join(SocketDir, iface+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("wg: opening the userspace device log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("wg: starting the userspace WireGuard device: %w", err)
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
			return fmt.Errorf("wg: userspace WireGuard device exited: %v (see %s)", err, logf.Name())
		case <-deadline.C:
			return errors.New("wg: userspace WireGuard device did not open its socket within 10s")
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// waitSocket waits until the UAPI socket of iface answers (a device another
// process runs), at most timeout.
func waitSocket(ctx context.Context, iface string, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !socketLive(iface) {
		select {
		case <-deadline.C:
			return fmt.Errorf("wg: no userspace WireGuard device at %s within %s: is the sidecar running?",
				filepath.Join(SocketDir, iface+".sock"), timeout)
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// StopSpawned ends the userspace device process EnsureDevice spawned for
// iface, if any (`meshlet cleanup`).
func StopSpawned(iface string) error {
	b, err := os.ReadFile(pidFile(iface))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(string(b))
	if err != nil {
		return fmt.Errorf("wg: bad pid file %s: %w", pidFile(iface), err)
	}
	if p, err := os.FindProcess(pid); err == nil {
		_ = p.Signal(syscall.SIGTERM)
	}
	return os.Remove(pidFile(iface))
}
