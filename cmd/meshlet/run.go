package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.zx2c4.com/wireguard/wgctrl"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/meshlet/meshlet/agent/runtime/config"
	"github.com/meshlet/meshlet/agent/runtime/metrics"
	"github.com/meshlet/meshlet/agent/runtime/node"
	"github.com/meshlet/meshlet/agent/runtime/runner"
	"github.com/meshlet/meshlet/netlinkx"
	"github.com/meshlet/meshlet/wg"
	"github.com/meshlet/meshlet/xtables"
)

func hostname(flagValue string) (string, error) {
	if flagValue != "" {
		return flagValue, nil
	}
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n, nil
	}
	return os.Hostname()
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		kubeconfig = os.Getenv("KUBECONFIG")
	}
	if kubeconfig == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}

// newRunCmd is `meshlet run`: the agent.
func newRunCmd() *cobra.Command {
	var cfg config.Config
	var iptBackend, userspaceDevice string
	c := &cobra.Command{
		Use:   "run",
		Short: "Run the node agent (the DaemonSet's command)",
		Args:  noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return usage(fmt.Errorf("invalid flags: %w", err))
			}
			if userspaceDevice != userspaceChild && userspaceDevice != userspaceSidecar {
				return usage(fmt.Errorf("--userspace-device: %q must be child or sidecar", userspaceDevice))
			}
			return runAgent(c.Context(), cfg, iptBackend, userspaceDevice)
		},
	}
	fs := c.Flags()
	fs.SortFlags = false
	cfg.RegisterTopology(fs)
	cfg.RegisterAgent(fs)
	registerIptablesBackend(fs, &iptBackend)
	fs.StringVar(&userspaceDevice, "userspace-device", userspaceChild,
		"who runs a userspace WireGuard device: child (meshlet starts it as a detached process) or sidecar (another container runs `meshlet wireguard-userspace`, sharing /var/run/wireguard; meshlet waits for its socket)")
	return c
}

// runAgent is the real data plane around the agent.
func runAgent(ctx context.Context, cfg config.Config, iptBackend, userspaceDevice string) error {
	name, err := hostname(cfg.Hostname)
	if err != nil {
		return fmt.Errorf("finding this node's name: %w", err)
	}
	log := newLogger(cfg.LogLevel).With("node", name)
	slog.SetDefault(log)
	log.Info("starting meshlet", "version", version, "interface", cfg.Interface, "wireguard", cfg.WireGuardMode)

	// The private key never leaves this process and the key file (0600).
	priv, created, err := wg.LoadOrCreateKey(cfg.KeyFile)
	if err != nil {
		return err
	}
	if created {
		log.Info("generated a new WireGuard key", "file", cfg.KeyFile)
	}
	kind, err := ensureDevice(ctx, cfg.Interface, cfg.WireGuardMode, userspaceDevice, log)
	if err != nil {
		return fmt.Errorf("WireGuard device %s: %w", cfg.Interface, err)
	}
	log.Info("WireGuard device ready", "interface", cfg.Interface, "kind", kind)
	wgc, err := wgctrl.New()
	if err != nil {
		return fmt.Errorf("opening wgctrl: %w", err)
	}
	defer wgc.Close()
	mgr, err := wg.NewManager(wg.Config{Interface: cfg.Interface, PrivateKey: priv, Client: wgc, Logger: log})
	if err != nil {
		return err
	}
	if _, err := xtables.Select(ctx, iptBackend, xtables.DefaultDir, xtables.Exec, log); err != nil {
		return err
	}
	host, err := netlinkx.New(netlinkx.Options{Logger: log})
	if err != nil {
		return err
	}
	defer host.Close()
	rc, err := restConfig(cfg.Kubeconfig)
	if err != nil {
		return fmt.Errorf("kubernetes client config: %w", err)
	}
	rc.UserAgent = "meshlet/" + version

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Someone deleting a meshlet route or downing kilo0: re-apply at once.
	netlinkChanges, err := host.Watch(ctx, cfg.Interface)
	if err != nil {
		return fmt.Errorf("watching netlink: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	repairs := metrics.NewSessionRepairs(reg)
	// Someone editing kilo0's peers (`wg set ... peer X remove`) raises no
	// netlink event: the userspace device meshlet hosts reports it on its
	// change feed, other devices are read periodically (wg.Manager.Watch,
	// README "Scale"). The same reads watch the sessions to kg-run peers.
	drift := mgr.Watch(ctx, wg.WatchOptions{
		Interval: driftInterval, Backstop: driftBackstop, SessionInterval: sessionInterval, FastInterval: sessionFastInterval,
		Sessions: cfg.RepairSessions, Probe: wg.ProbeICMP,
		OnRepair: func(peer string) { repairs.WithLabelValues(peer).Inc() },
	})
	changes := mergeSignals(ctx, netlinkChanges, drift)
	facts := &node.Facts{Host: host, WireGuard: mgr, Version: version, HostnameAddrs: hostnameAddrs(ctx, log)}
	agent, err := runner.New(runner.Options{
		Config: cfg, Node: name, RestConfig: rc, WireGuard: &node.WireGuard{Manager: mgr}, Host: &node.Host{Host: host},
		Self: facts, HostEvents: changes, Registry: reg, Log: log, Version: version,
	})
	if err != nil {
		return err
	}
	if _, err := agent.Serve(ctx, cfg.Listen); err != nil {
		return err
	}
	if cfg.StatusSocket != "" {
		if err := agent.ServeStatus(ctx, cfg.StatusSocket); err != nil {
			return err
		}
	}
	go cleanupKiloWhenReady(ctx, agent.Loop.Ready, host, log)
	err = agent.Run(ctx)
	// SIGTERM: the data plane stays as it is; the next meshlet adopts it.
	log.Info("meshlet stopped; data plane left in place")
	return err
}

// hostnameAddrs resolves this host's name, the first source of kg's choice
// of the private and public IP. It is asked once, briefly: before the mesh
// is up the cluster's DNS may not be reachable (/etc/hosts answers at once).
func hostnameAddrs(ctx context.Context, log *slog.Logger) []netip.Addr {
	h, err := os.Hostname()
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", h)
	if err != nil {
		log.Debug("the host name does not resolve; its addresses are not used for the private IP", "hostname", h, "error", err)
		return nil
	}
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	return addrs
}

// registerIptablesBackend adds --iptables-backend (run and cleanup must
// agree on it: the chains live in one backend).
func registerIptablesBackend(fs *pflag.FlagSet, v *string) {
	fs.StringVar(v, "iptables-backend", xtables.ModeAuto,
		"iptables backend: auto (the host's: kubelet's hint chain, else the one holding rules; in meshlet's image), nft, legacy, or system (the iptables in PATH)")
}

// noArgs refuses positional arguments as a usage error.
func noArgs(c *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usage(fmt.Errorf("unexpected argument %q (see '%s --help')", args[0], c.CommandPath()))
	}
	return nil
}

// How often the WireGuard device is read (wg.WatchOptions): without a
// change feed at most every driftInterval (less often on a large device),
// with one every driftBackstop; the counters of kg-run peers every
// sessionInterval, every sessionFastInterval while one's session has
// traffic going unanswered.
const (
	driftInterval       = time.Second
	driftBackstop       = 30 * time.Second
	sessionInterval     = 250 * time.Millisecond
	sessionFastInterval = 50 * time.Millisecond
)

// mergeSignals forwards every signal of ins to one coalescing channel.
func mergeSignals(ctx context.Context, ins ...<-chan struct{}) <-chan struct{} {
	out := make(chan struct{}, 1)
	for _, in := range ins {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case _, ok := <-in:
					if !ok {
						return
					}
					select {
					case out <- struct{}{}:
					default:
					}
				}
			}
		}()
	}
	return out
}
