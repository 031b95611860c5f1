package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.zx2c4.com/wireguard/wgctrl"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/meshlet/meshlet/agent/cluster"
	"github.com/meshlet/meshlet/agent/config"
	"github.com/meshlet/meshlet/agent/events"
	"github.com/meshlet/meshlet/agent/metrics"
	"github.com/meshlet/meshlet/agent/node"
	"github.com/meshlet/meshlet/agent/reconcile"
	"github.com/meshlet/meshlet/agent/topology"
	"github.com/meshlet/meshlet/netlinkx"
	"github.com/meshlet/meshlet/wg"
)

// heartbeat: the loop runs at least this often so last-seen (60 s
// readiness window, as Kilo) stays fresh whatever --resync-period says.
const heartbeat = 10 * time.Second

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

func runAgent(ctx context.Context, args []string) error {
	var cfg config.Config
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	cfg.RegisterTopology(fs)
	cfg.RegisterAgent(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid flags:\n%w", err)
	}
	name, err := hostname(cfg.Hostname)
	if err != nil {
		return fmt.Errorf("finding this node's name: %w", err)
	}
	log := newLogger(cfg.LogLevel).With("node", name)
	slog.SetDefault(log)
	log.Info("starting meshlet", "version", version, "interface", cfg.Interface, "wireguard", cfg.WireGuard)

	// The private key never leaves this process and the key file (0600).
	priv, created, err := wg.LoadOrCreateKey(cfg.KeyFile)
	if err != nil {
		return err
	}
	if created {
		log.Info("generated a new WireGuard key", "file", cfg.KeyFile)
	}
	kind, err := ensureDevice(ctx, cfg.Interface, cfg.WireGuard, log)
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
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	am := metrics.NewAgent(reg)
	wgAct := &node.WireGuard{Manager: mgr}
	collector := metrics.NewCollector(cfg.Interface, wgAct, cfg.MetricsCompat == "wireguard-exporter", nil)
	reg.MustRegister(collector)

	loop := &reconcile.Loop{Node: name, Settings: cfg.Settings(), Metrics: am, Log: log, Resync: cfg.ResyncPeriod}
	local, err := cluster.NewLocal(cluster.LocalOptions{Config: rc, Client: client, Namespace: cfg.Namespace, Node: name, Notify: loop.Notify, Log: log})
	if err != nil {
		return err
	}
	remotes := &cluster.Remotes{Notify: loop.Notify, Log: log, Metrics: am}
	source := &cluster.Source{Local: local, Remotes: remotes, ClusterName: cfg.ClusterName}
	facts := &node.Facts{
		Host: host, WireGuard: wgAct, PublicKey: mgr.PublicKey(), Interface: cfg.Interface, Internal: cfg.InternalPrefix(), Port: cfg.Port,
		Annotations: func() map[string]string {
			if n := local.SelfNode(); n != nil {
				return n.Annotations
			}
			return nil
		},
	}
	loop.Snapshots = source
	loop.Self = facts
	loop.WireGuard = wgAct
	loop.Host = &node.Host{Host: host, Underlay: facts.Underlay}
	loop.Publisher = &cluster.Publisher{Client: client, Local: local, Node: name}
	loop.Rejections = &events.Sink{Client: client, Node: name, Metrics: am, Log: log, Meshes: source.MeshOf}
	loop.OnPlan = func(p topology.Plan) {
		source.OnPlan(p)
		collector.SetPeers(p.WireGuard.Peers)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv, err := serve(cfg.Listen, reg, loop, log)
	if err != nil {
		return err
	}
	defer func() {
		sctx, c := context.WithTimeout(context.Background(), 2*time.Second)
		defer c()
		_ = srv.Shutdown(sctx)
	}()

	remotes.Start(ctx)
	local.Start(ctx)
	// Someone deleting a meshlet route or downing kilo0: re-apply at once.
	changes, err := host.Watch(ctx, cfg.Interface)
	if err != nil {
		return fmt.Errorf("watching netlink: %w", err)
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-changes:
				loop.Notify(time.Now())
			}
		}
	}()
	go func() {
		t := time.NewTicker(heartbeat)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				loop.Notify(time.Time{})
			}
		}
	}()
	if !local.WaitForSync(ctx) {
		return ctx.Err()
	}
	log.Info("local caches synced")
	err = loop.Run(ctx)
	// SIGTERM: the data plane stays as it is; the next meshlet adopts it.
	log.Info("meshlet stopped; data plane left in place")
	return err
}

// serve exposes /metrics, /healthz and /readyz.
func serve(addr string, reg *prometheus.Registry, loop *reconcile.Loop, log *slog.Logger) (*http.Server, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !loop.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			msg := loop.LastError()
			if msg == "" {
				msg = "initial sync not done"
			}
			_, _ = w.Write([]byte(msg + "\n"))
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "err", err)
		}
	}()
	log.Info("serving metrics and health", "addr", ln.Addr().String())
	return srv, nil
}
