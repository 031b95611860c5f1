// Package runner assembles meshlet's agent: watchers, the reconcile loop,
// events, metrics and the HTTP endpoints, around a data plane that the
// caller provides (the real wg/ and netlinkx/ in `meshlet run`, fakes in the
// integration tests against real API servers).
package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/agent/runtime/config"
	"github.com/meshlet/meshlet/agent/runtime/events"
	"github.com/meshlet/meshlet/agent/runtime/meshstatus"
	"github.com/meshlet/meshlet/agent/runtime/metrics"
	"github.com/meshlet/meshlet/agent/runtime/reconcile"
	"github.com/meshlet/meshlet/agent/runtime/status"
)

// MinRunInterval: the loop runs at least this often so that last-seen (Kilo's
// 60 s readiness window) stays fresh whatever --resync-period says.
const MinRunInterval = 10 * time.Second

// WireGuard is the device actuator and its stats.
type WireGuard interface {
	reconcile.WireGuard
	metrics.StatsSource
}

// Options are the agent's parts.
type Options struct {
	Config     config.Config // validated
	Node       string
	RestConfig *rest.Config
	WireGuard  WireGuard
	Host       reconcile.Host
	Self       reconcile.SelfSource
	// HostEvents signals changes under meshlet's feet (deleted route, kilo0
	// down); nil when the host cannot watch.
	HostEvents <-chan struct{}
	Registry   *prometheus.Registry
	Log        *slog.Logger
	// RemoteProbe is how often remote API servers are probed (default 5 s).
	RemoteProbe time.Duration
	// Version is meshlet's, shown by /status.
	Version string
}

// Drifter is a Host that can tell, without changing anything, how the host
// differs from a plan (/status shows it; node.Host is one).
type Drifter interface {
	Drift(ctx context.Context, plan topology.Plan) ([]string, error)
}

// Agent is a running meshlet.
type Agent struct {
	opts    Options
	Loop    *reconcile.Loop
	Local   *cluster.Local
	Remotes *cluster.Remotes
	Metrics *metrics.Agent
	peers   *metrics.Collector
	// meshStatus is nil with --clustermesh-status=false.
	meshStatus *meshstatus.Writer
	events     record.EventBroadcaster
	client     kubernetes.Interface
}

// New assembles the agent.
func New(o Options) (*Agent, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	client, err := kubernetes.NewForConfig(o.RestConfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	am := metrics.NewAgent(o.Registry)
	compat, err := metrics.ParseCompat(o.Config.MetricsCompat)
	if err != nil {
		return nil, fmt.Errorf("--metrics-compat: %w", err)
	}
	collector := metrics.NewCollector(o.Config.Interface, o.WireGuard, compat.WireGuardExporter, nil)
	o.Registry.MustRegister(collector)

	loop := &reconcile.Loop{Node: o.Node, Settings: o.Config.Settings(), Resync: o.Config.ResyncPeriod,
		Self: o.Self, WireGuard: o.WireGuard, Host: o.Host, PeerLabels: collector, Metrics: am, Log: o.Log}
	local, err := cluster.NewLocal(cluster.LocalOptions{Config: o.RestConfig, Client: client, Namespace: o.Config.Namespace,
		Node: o.Node, Notify: loop.Notify, Log: o.Log})
	if err != nil {
		return nil, err
	}
	remotes := &cluster.Remotes{Secrets: local.SecretData, Notify: loop.Notify, Log: o.Log, Metrics: am, ProbeInterval: o.RemoteProbe}
	broadcaster := record.NewBroadcaster()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: events.Component, Host: o.Node})
	loop.Snapshots = &cluster.Source{Local: local, Remotes: remotes, ClusterName: o.Config.ClusterName}
	loop.Publisher = &cluster.Publisher{Client: client, Local: local, Node: o.Node}
	loop.Remotes = remotes
	var ms *meshstatus.Writer
	if o.Config.ClusterMeshStatus {
		kiloREST, err := cluster.KiloClient(o.RestConfig)
		if err != nil {
			return nil, err
		}
		ms = &meshstatus.Writer{Client: client, Kilo: kiloREST, Namespace: o.Config.Namespace, Identity: o.Node,
			ClusterName: o.Config.ClusterName, Meshes: local.Meshes, Remotes: remotes.Status, Log: o.Log}
		loop.MeshStatus = ms
	}
	loop.Rejections = &events.Sink{Recorder: recorder, UIDs: local.UID, Node: o.Node, Metrics: am, Log: o.Log}
	if compat.Kilo {
		kilo := metrics.NewKilo(am)
		o.Registry.MustRegister(kilo)
		loop.Rejections = plans{loop.Rejections, kilo}
	}
	return &Agent{opts: o, Loop: loop, Local: local, Remotes: remotes, Metrics: am, peers: collector, meshStatus: ms, events: broadcaster, client: client}, nil
}

// plans hands every plan the loop reports to each of its sinks: the
// rejection sink, and with --metrics-compat=kilo the kilo_* series.
type plans []reconcile.RejectionSink

func (ps plans) Report(ctx context.Context, plan topology.Plan) {
	for _, p := range ps {
		p.Report(ctx, plan)
	}
}

// SelfAnnotations returns this node's annotations as last seen (for
// force-endpoint).
func (a *Agent) SelfAnnotations() map[string]string {
	if n := a.Local.SelfNode(); n != nil {
		return n.Annotations
	}
	return nil
}

// Run runs the agent until ctx ends. The data plane is left in place.
func (a *Agent) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Events are written in the background, never in the loop's way.
	a.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.client.CoreV1().Events("")})
	defer a.events.Shutdown()
	a.Remotes.Start(ctx)
	if a.meshStatus != nil {
		a.meshStatus.Start(ctx)
	}
	a.Local.Start(ctx)
	go a.forward(ctx)
	if !a.Local.WaitForSync(ctx) {
		return ctx.Err()
	}
	a.opts.Log.Info("local caches synced", "node", a.opts.Node)
	return a.Loop.Run(ctx)
}

// forward turns host events and MinRunInterval into loop runs.
func (a *Agent) forward(ctx context.Context) {
	t := time.NewTicker(MinRunInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.opts.HostEvents:
			a.Loop.Notify(time.Now())
		case <-t.C:
			a.Loop.Notify(time.Time{})
		}
	}
}

// Status is this node's state now (`meshlet status`): the last plan, the
// device as read now with each peer's health, the host's drift from the
// plan, the remote watchers.
func (a *Agent) Status(ctx context.Context) status.Status {
	run, have := a.Loop.Last()
	in := status.Input{Node: a.opts.Node, Cluster: a.opts.Config.ClusterName, Version: a.opts.Version, Now: time.Now(),
		Run: run, HaveRun: have, Ready: a.Loop.Ready(), Remotes: a.Remotes.Status()}
	in.Device, in.DeviceErr = a.opts.WireGuard.Stats(ctx)
	if in.DeviceErr == nil {
		in.Health = a.peers.Health(in.Device.Peers)
	}
	if d, ok := a.opts.Host.(Drifter); ok && have {
		in.Drift, in.DriftErr = d.Drift(ctx, run.Plan)
	}
	return status.Build(in)
}

// Serve exposes /metrics, /healthz, /readyz and /status on addr until ctx ends; it
// returns the bound address (addr may use port 0).
func (a *Agent) Serve(ctx context.Context, addr string) (string, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.opts.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !a.Loop.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			msg := a.Loop.LastError()
			if msg == "" {
				msg = "initial sync not done"
			}
			_, _ = w.Write([]byte(msg + "\n"))
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(a.Status(ctx))
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("listening on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.opts.Log.Error("metrics server", "error", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, c := context.WithTimeout(context.Background(), 2*time.Second)
		defer c()
		_ = srv.Shutdown(sctx)
	}()
	return ln.Addr().String(), nil
}
