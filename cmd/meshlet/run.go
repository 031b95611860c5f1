package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.zx2c4.com/wireguard/wgctrl"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"

	"github.com/meshlet/meshlet/agent/runtime/cni"
	"github.com/meshlet/meshlet/agent/runtime/config"
	"github.com/meshlet/meshlet/agent/runtime/metrics"
	"github.com/meshlet/meshlet/agent/runtime/node"
	"github.com/meshlet/meshlet/agent/runtime/reconcile"
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

func restConfig(kubeconfig string) (*rest.Config, error) { return restConfigAt("", kubeconfig) }

// restConfigAt is the client configuration from master (kg's --master:
// the API server's address over the kubeconfig's) and kubeconfig ("":
// $KUBECONFIG, else in-cluster).
func restConfigAt(master, kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		kubeconfig = os.Getenv("KUBECONFIG")
	}
	if kubeconfig == "" && master == "" {
		// In the cluster, the API server is a hop away: gzip on its watch
		// streams (every Lease renewal of the location, every Node's
		// last-seen) costs CPU on both ends to save bandwidth that is not
		// scarce there (docs/performance.md#beside-kg). A kubeconfig (which
		// may name a server across a WAN) decides for itself with
		// disable-compression, as remote clusters' do.
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, err
		}
		rc.DisableCompression = true
		return rc, nil
	}
	return clientcmd.BuildConfigFromFlags(master, kubeconfig)
}

// agentFlags are meshlet run's and meshlet kg's: the agent's configuration
// and the two flags only the command line has.
type agentFlags struct {
	cfg                         config.Config
	iptBackend, userspaceDevice string
}

func (f *agentFlags) register(fs *pflag.FlagSet) {
	fs.SortFlags = false
	f.cfg.RegisterTopology(fs)
	f.cfg.RegisterAgent(fs)
	f.cfg.RegisterKg(fs)
	registerIptablesBackend(fs, &f.iptBackend)
	fs.StringVar(&f.userspaceDevice, "userspace-device", userspaceChild,
		"who runs a userspace WireGuard device: child (meshlet starts it as a detached process) or sidecar (another container runs meshlet wireguard-userspace, sharing /var/run/wireguard; meshlet waits for its socket)")
}

func (f *agentFlags) run(c *cobra.Command) error {
	if f.cfg.PrintVersion {
		fmt.Fprintln(c.OutOrStdout(), version)
		return nil
	}
	if err := f.cfg.Validate(); err != nil {
		return usage(fmt.Errorf("invalid flags: %w", err))
	}
	if f.userspaceDevice != userspaceChild && f.userspaceDevice != userspaceSidecar {
		return usage(fmt.Errorf("--userspace-device: %q must be child or sidecar", f.userspaceDevice))
	}
	return runAgent(c.Context(), f.cfg, f.iptBackend, f.userspaceDevice)
}

// newRunCmd is `meshlet run`: the agent.
func newRunCmd() *cobra.Command {
	f := &agentFlags{}
	c := &cobra.Command{
		Use:   "run",
		Short: "Run the node agent (the DaemonSet's command)",
		Args:  noArgs,
		RunE:  func(c *cobra.Command, _ []string) error { return f.run(c) },
	}
	f.register(c.Flags())
	return c
}

// newKgCmd is `meshlet kg`: the agent with kg's command line and defaults,
// so meshlet's image runs in Kilo's own DaemonSet with only the image
// changed (docs/dropin.md). The image's entrypoint given flags and no
// command runs it (execute), as does a binary called kg; kg's version and
// webhook subcommands are there too.
func newKgCmd() *cobra.Command {
	f := &agentFlags{}
	c := &cobra.Command{
		Use:   "kg [flags]",
		Short: "Run the agent as kg would: kg's flags and defaults (the drop-in for Kilo's DaemonSet)",
		Long: "Run the agent with kg 0.7's command line: every kg flag with kg's default (--cni=true, --clean-up=true,\n" +
			"the key in /var/lib/kilo/key, kilo_* metrics), meshlet's own flags besides (docs/dropin.md#flags).",
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error { return f.run(c) },
	}
	f.register(c.Flags())
	if err := config.SetDefaults(c.Flags(), config.KgDefaults); err != nil {
		panic(err) // a programming error: KgDefaults names a flag that does not exist
	}
	c.AddCommand(newVersionCmd(), newWebhookCmd())
	return c
}

// kgMode tells whether a command line is kg's: flags without a command
// (Kilo's manifests pass only flags to the image's entrypoint).
func kgMode(args []string) bool {
	return len(args) > 0 && strings.HasPrefix(args[0], "-") && args[0] != "-h" && args[0] != "--help"
}

// runAgent is the real data plane around the agent. Nothing is set up on
// the host before the command line and the kubeconfig were accepted, and a
// start that fails removes the device it created.
func runAgent(ctx context.Context, cfg config.Config, iptBackend, userspaceDevice string) (err error) {
	name, err := hostname(cfg.Hostname)
	if err != nil {
		return fmt.Errorf("finding this node's name: %w", err)
	}
	log := newLogger(cfg.LogLevel).With("node", name)
	slog.SetDefault(log)
	log.Info("starting meshlet", "version", version, "interface", cfg.Interface, "wireguard", cfg.WireGuardMode)
	rc, err := restConfigAt(cfg.Master, cfg.Kubeconfig)
	if err != nil {
		return fmt.Errorf("kubernetes client config: %w", err)
	}
	rc.UserAgent = "meshlet/" + version
	if _, err := xtables.Select(ctx, iptBackend, xtables.DefaultDir, xtables.Exec, log); err != nil {
		return err
	}

	// The private key never leaves this process and the key file (0600).
	priv, created, err := wg.LoadOrCreateKey(cfg.KeyFile)
	if err != nil {
		return err
	}
	if created {
		log.Info("generated a new WireGuard key", "file", cfg.KeyFile)
	}
	if !cfg.CreateInterface {
		userspaceDevice = userspaceSidecar // another process runs it (kg's --create-interface=false)
	}
	dev, err := ensureDevice(ctx, cfg.Interface, cfg.WireGuardMode, userspaceDevice, log)
	if err != nil {
		return fmt.Errorf("WireGuard device %s: %w", cfg.Interface, err)
	}
	log.Info("WireGuard device ready", "interface", cfg.Interface, "kind", dev.Kind)
	running := false
	defer func() {
		if !running && dev.Created {
			removeDevice(dev, log)
		}
	}()
	wgc, err := wgctrl.New()
	if err != nil {
		return fmt.Errorf("opening wgctrl: %w", err)
	}
	defer wgc.Close()
	mgr, err := wg.NewManager(wg.Config{Interface: cfg.Interface, PrivateKey: priv, Client: wgc, Logger: log})
	if err != nil {
		return err
	}
	// The agent's one clock (docs/architecture.md#one-clock).
	clk := clock.RealClock{}
	host, err := netlinkx.New(netlinkx.Options{Logger: log, Clock: clk})
	if err != nil {
		return err
	}
	defer host.Close()

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
	// docs/performance.md#drift-how-it-is-found-and-its-bound). The same
	// reads watch the sessions to kg-run peers.
	drift := mgr.Watch(ctx, wg.WatchOptions{
		Interval: driftInterval, Backstop: driftBackstop, SessionInterval: sessionInterval, FastInterval: sessionFastInterval,
		Sessions: cfg.RepairSessions, Probe: sessionProbe, Clock: clk,
		OnRepair: func(peer string) { repairs.WithLabelValues(peer).Inc() },
	})
	changes := mergeSignals(ctx, netlinkChanges, drift)
	facts := &node.Facts{Host: host, WireGuard: mgr, Version: version, HostnameAddrs: hostnameAddrs(ctx, log)}
	var nodeHost reconcile.Host = &node.Host{Host: host, Interface: cfg.Interface}
	if cfg.CNI {
		facts.CNI = &cni.File{Path: cfg.CNIPath}
		nodeHost = &node.Host{Host: host, CNI: facts.CNI, Interface: cfg.Interface}
	}
	agent, err := runner.New(runner.Options{
		Clock:  clk,
		Config: cfg, Node: name, RestConfig: rc, WireGuard: &node.WireGuard{Manager: mgr}, Host: nodeHost,
		Self: facts, HostEvents: changes, Registry: reg, Log: log, Version: version,
	})
	if err != nil {
		return err
	}
	if _, err := agent.Serve(ctx, cfg.Listen); err != nil {
		return err
	}
	if cfg.StatusSocket != "" {
		// /status is for the operator; a node that cannot serve it (a
		// read-only /run without a volume there) still meshes. A path held
		// by something else (a second agent, a file) must not be started over.
		if err := agent.ServeStatus(ctx, cfg.StatusSocket); errors.Is(err, runner.ErrStatusSocketTaken) {
			return err
		} else if err != nil {
			log.Error("status socket unavailable: meshlet status on this node will not answer (mount a writable directory there, e.g. an emptyDir)",
				"socket", cfg.StatusSocket, "error", err)
		}
	}
	running = true
	go cleanupKiloWhenReady(ctx, clk, agent.Loop.Ready, host, log)
	err = agent.Run(ctx)
	if !cfg.CleanUp {
		// SIGTERM: the data plane stays as it is; the next meshlet adopts it.
		log.Info("meshlet stopped; data plane left in place")
		return err
	}
	// kg's --clean-up: remove what was set up when the node is left, keep
	// it when a new agent follows (docs/dropin.md#clean-up).
	lctx, lcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer lcancel()
	leaving, why := agent.Leaving(lctx)
	if !leaving {
		log.Info("meshlet stopped; data plane left in place for the agent that follows", "why", why)
		return err
	}
	log.Info("meshlet stopped and the node is left: removing what it set up", "why", why)
	if cerr := agent.Depart(lctx, host, mgr, cfg.CleanUpInterface); cerr != nil {
		log.Error("cleaning up", "error", cerr)
	}
	if cfg.CleanUpInterface {
		removeDevice(dev, log)
	}
	return err
}

// removeDevice removes a WireGuard device meshlet created: the kernel link,
// or the userspace device process (its TUN goes with it).
func removeDevice(dev *wg.Device, log *slog.Logger) {
	switch dev.Kind {
	case wg.KindKernel:
		if out, err := exec.Command("ip", "link", "del", dev.Name).CombinedOutput(); err != nil {
			log.Warn("removing the WireGuard device", "interface", dev.Name, "error", err, "output", strings.TrimSpace(string(out)))
		}
	default:
		if err := wg.StopSpawned(dev.Name); err != nil {
			log.Warn("stopping the userspace WireGuard device", "interface", dev.Name, "error", err)
		}
		_ = dev.Close()
	}
	log.Info("removed the WireGuard device", "interface", dev.Name)
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
// sessionInterval while they carry a flow (wg.FlowRate), every sessionFastInterval
// while one's session has traffic going unanswered, and every second
// (wg.WatchOptions.QuietInterval's default) while they are quiet.
const (
	driftInterval       = time.Second
	driftBackstop       = 30 * time.Second
	sessionInterval     = 100 * time.Millisecond
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

// sessionProbe is wg's session probe: one ICMP echo to a peer's WireGuard
// IP (docs/kilo-compatibility.md#half-dead).
func sessionProbe(ctx context.Context, addr netip.Addr) error {
	return netlinkx.Echo(ctx, netip.Addr{}, []netip.Addr{addr}, "meshlet session probe")
}
