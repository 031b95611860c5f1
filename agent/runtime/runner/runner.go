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
	"net/http/pprof"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/diagnose"
	"github.com/meshlet/meshlet/agent/core/failover"
	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/agent/runtime/config"
	"github.com/meshlet/meshlet/agent/runtime/events"
	"github.com/meshlet/meshlet/agent/runtime/grants"
	"github.com/meshlet/meshlet/agent/runtime/health"
	"github.com/meshlet/meshlet/agent/runtime/leadership"
	"github.com/meshlet/meshlet/agent/runtime/meshstatus"
	"github.com/meshlet/meshlet/agent/runtime/metrics"
	"github.com/meshlet/meshlet/agent/runtime/reconcile"
	"github.com/meshlet/meshlet/agent/runtime/status"
	"github.com/meshlet/meshlet/wg"
)

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
	// down, the WireGuard device drifted, a half-dead session's reading to
	// judge); nil when the host cannot watch. Each runs the loop without a
	// storm's window (reconcile.Loop.NotifyNow).
	HostEvents <-chan struct{}
	Registry   *prometheus.Registry
	Log        *slog.Logger
	// RemoteProbe is how often remote API servers are probed (default 5 s).
	RemoteProbe time.Duration
	// Version is meshlet's, shown by /status.
	Version string
	// Grants are the features the agent's RBAC and the cluster's CRDs
	// allow; nil: asked at New (agent/runtime/grants).
	Grants grants.Set
	// Clock is the agent's one clock: it stamps every observation and
	// drives every timer (docs/architecture.md#one-clock). nil: the real
	// clock.
	Clock clock.WithTicker
}

// Drifter is a Host that can tell, without changing anything, how the host
// differs from a plan (/status shows it; node.Host is one).
type Drifter interface {
	Drift(ctx context.Context, plan topology.Plan) ([]string, error)
}

// Sysctler is a Host that reads the node's sysctls (/status: ip_forward;
// node.Host is one).
type Sysctler interface {
	Sysctl(key string) (string, error)
}

// EndpointRouter is a Host that reads the underlay's routes to addresses
// (/status: the routes to the peers' endpoints; node.Host is one).
type EndpointRouter interface {
	EndpointRoutes(addrs []netip.Addr) (map[netip.Addr]diagnose.EndpointRoute, error)
}

// FirewallObserver is a Host that hands each apply's iptables changes to a
// function (kg's kilo_iptables_operations_total; node.Host is one).
type FirewallObserver interface {
	ObserveFirewall(f func(changes []string))
}

// Unresolver is a WireGuard that remembers the endpoints its last apply
// could not resolve (/status; node.WireGuard is one).
type Unresolver interface {
	Unresolved() []wg.UnresolvedEndpoint
}

// Agent is a running meshlet.
type Agent struct {
	opts    Options
	Loop    *reconcile.Loop
	Local   *cluster.Local
	Remotes *cluster.Remotes
	secrets *cluster.SecretWatch
	Metrics *metrics.Agent
	peers   *metrics.Collector
	// meshStatus is nil with --clustermesh-status=false.
	meshStatus *meshstatus.Writer
	// elector is nil with --leader-election=false, prober with
	// --health-probe-interval=0.
	elector *leadership.Elector
	prober  *health.Prober
	events  record.EventBroadcaster
	client  kubernetes.Interface
	// leases is client in protobuf, for the location's Lease (a renewal
	// a second, read by every node of the location) and the ClusterMesh
	// status writer's (a renewal every 5 s).
	leases kubernetes.Interface
	// leaving is why this node goes away, once the agent stopping found
	// it so (leavingSelf hands it to the planner).
	leaving atomic.Pointer[string]
	// left is Leaving's judgement, once made as the agent stopped.
	left *leftJudgement
}

type leftJudgement struct {
	leaving bool
	why     string
	// successor: another agent takes the node over (kg, the way back).
	successor bool
}

// New assembles the agent.
func New(o Options) (*Agent, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	client, err := kubernetes.NewForConfig(o.RestConfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	leases, err := cluster.WatchClient(o.RestConfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	if o.Grants == nil {
		o.Grants = askGrants(client, o.Config.Namespace, o.Log)
	}
	if !o.Grants.On(grants.Mesh) {
		return nil, fmt.Errorf("the agent may not mesh this cluster: it lacks %s (kg's ClusterRole grants that much: docs/dropin.md#grants)",
			strings.Join(o.Grants.Off()[0].Missing, ", "))
	}
	for _, f := range o.Grants.Off() {
		o.Log.Warn("feature off: the agent lacks a grant or a CRD (docs/dropin.md#grants)", "feature", f.Name, "missing", strings.Join(f.Missing, "; "))
	}
	if !o.Grants.On(grants.LeaderElection) {
		o.Config.LeaderElection = false // Kilo's rule alone
	}
	if !o.Grants.On(grants.ClusterMeshStatus) || !o.Grants.On(grants.ClusterMesh) {
		o.Config.ClusterMeshStatus = false
	}
	am := metrics.NewAgent(o.Registry)
	metrics.NewBuildInfo(o.Registry, o.Version)
	compat, err := metrics.ParseCompat(o.Config.MetricsCompat)
	if err != nil {
		return nil, fmt.Errorf("--metrics-compat: %w", err)
	}
	collector := metrics.NewCollector(o.Config.Interface, o.WireGuard, compat.WireGuardExporter, o.Clock.Now)
	o.Registry.MustRegister(collector)

	loop := &reconcile.Loop{Node: o.Node, Settings: o.Config.Settings(), Resync: o.Config.ResyncPeriod,
		Self: o.Self, WireGuard: o.WireGuard, Host: o.Host, PeerLabels: collector, Metrics: am, Log: o.Log, Clock: o.Clock}
	local, err := cluster.NewLocal(cluster.LocalOptions{Config: o.RestConfig, Client: client, Namespace: o.Config.Namespace,
		NoClusterMeshes: !o.Grants.On(grants.ClusterMesh), Node: o.Node, Notify: loop.Notify, Log: o.Log, Clock: o.Clock, Limits: o.Config.Limits()})
	if err != nil {
		return nil, err
	}
	secrets, err := cluster.NewSecretWatch(o.RestConfig, o.Config.Namespace, loop.Notify, o.Log)
	if err != nil {
		return nil, err
	}
	secrets.Allowed = grants.SecretAccess(client, o.Config.Namespace)
	secrets.Clock = o.Clock
	remotes := &cluster.Remotes{Secrets: secrets, Notify: loop.Notify, Log: o.Log, Metrics: am, ProbeInterval: o.RemoteProbe, Clock: o.Clock,
		Policy: cluster.KubeconfigPolicy{AllowExec: o.Config.InsecureKubeconfigExec}, Limits: o.Config.Limits()}
	broadcaster := record.NewBroadcaster()
	var recorder record.EventRecorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: events.Component, Host: o.Node})
	if !o.Grants.On(grants.Events) {
		recorder = discard{} // logs and metrics still say it
	}
	loop.Snapshots = &cluster.Source{Local: local, Remotes: remotes, ClusterName: o.Config.ClusterName}
	loop.Publisher = &cluster.Publisher{Client: client, Local: local, Node: o.Node, Log: o.Log}
	loop.Remotes = remotes
	var ms *meshstatus.Writer
	if o.Config.ClusterMeshStatus {
		kiloREST, err := cluster.KiloClient(o.RestConfig)
		if err != nil {
			return nil, err
		}
		ms = &meshstatus.Writer{Kilo: kiloREST, ClusterName: o.Config.ClusterName, Meshes: local.Meshes, Remotes: remotes.Status, Log: o.Log, Now: o.Clock.Now,
			NoCRD: !o.Grants.On(grants.ClusterMeshStatusSchema)}
		loop.MeshStatus = ms
	}
	loop.Rejections = &events.Sink{Recorder: recorder, UIDs: local.UID, Node: o.Node, Metrics: am, Log: o.Log, Clock: o.Clock}
	if compat.Kilo {
		kiloMetrics := metrics.NewKilo(am)
		o.Registry.MustRegister(kiloMetrics)
		loop.Rejections = plans{loop.Rejections, kiloMetrics}
		loop.Snapshots = kiloSnapshots{Snapshotter: loop.Snapshots, kilo: kiloMetrics}
		if fo, ok := o.Host.(FirewallObserver); ok {
			fo.ObserveFirewall(kiloMetrics.IPTablesChanges)
		}
	}
	a := &Agent{opts: o, Loop: loop, Local: local, Remotes: remotes, secrets: secrets, Metrics: am, peers: collector, meshStatus: ms, events: broadcaster, client: client, leases: leases}
	a.failover(recorder)
	return a, nil
}

// askGrants asks which features the agent may use; when the API server
// cannot be asked, it assumes all (a refused request then says which).
func askGrants(client kubernetes.Interface, namespace string, log *slog.Logger) grants.Set {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	set, err := grants.Check(ctx, client, namespace)
	if err != nil {
		log.Warn("could not ask the API server which features the agent may use; assuming all", "error", err)
		return grants.All()
	}
	return set
}

// discard is the event recorder without the grant to write Events.
type discard struct{}

func (discard) Event(runtime.Object, string, string, string)                  {}
func (discard) Eventf(runtime.Object, string, string, string, ...interface{}) {}
func (discard) AnnotatedEventf(runtime.Object, map[string]string, string, string, string, ...interface{}) {
}

// failover assembles the per-location Lease and the health probes
// (docs/failover.md): the Lease and the probes' findings go into the
// planner's input, its decisions back to them after every run.
func (a *Agent) failover(recorder record.EventRecorder) {
	o, loop := a.opts, a.Loop
	if !o.Config.LeaderElection && o.Config.HealthProbeInterval <= 0 {
		return
	}
	lm := metrics.NewLeadership(o.Registry)
	var follow followers
	if o.Config.LeaderElection {
		a.elector = &leadership.Elector{Client: a.leases, Namespace: o.Config.Namespace, Identity: o.Node,
			Duration: o.Config.LeaseDuration, Renew: o.Config.LeaseRenew,
			NodeUID:  func(n string) (types.UID, bool) { return a.Local.UID("Node", "", n) },
			Recorder: recorder, Metrics: lm, Notify: loop.Notify, Log: o.Log, Clock: o.Clock}
		loop.Snapshots = &leaseSource{Snapshotter: loop.Snapshots, elector: a.elector, local: a.Local, settings: o.Config.Settings()}
		loop.Self = &leavingSelf{SelfSource: loop.Self, why: &a.leaving}
		follow = append(follow, a.elector)
	}
	if o.Config.HealthProbeInterval > 0 {
		a.prober = &health.Prober{Stats: o.WireGuard.Stats, Interval: o.Config.HealthProbeInterval, Notify: loop.Notify, Metrics: lm, Log: o.Log, Clock: o.Clock}
		loop.Self = &healthSelf{SelfSource: loop.Self, prober: a.prober}
		follow = append(follow, proberFollower{a.prober})
	}
	loop.Leadership = follow
}

// leaseSource adds the location's Lease to the snapshot. Before the first
// plan it watches the Lease of this node's location as its Node says (a
// restarted leader renews it at once), and the loop waits until the
// Lease has been listed: no plan without knowing who holds it.
type leaseSource struct {
	reconcile.Snapshotter
	elector  *leadership.Elector
	local    *cluster.Local
	settings topology.Settings
	started  bool
}

func (s *leaseSource) Synced() bool {
	if !s.Snapshotter.Synced() {
		return false
	}
	if !s.started {
		s.started = true
		name := ""
		if n := s.local.SelfNode(); n != nil && (s.settings.Granularity == "" || s.settings.Granularity == topology.GranularityLocation) {
			name = failover.LeaseName(topology.NodeLocation(kilo.ConvertNode(n, "").Node, s.settings))
		}
		s.elector.Watch(name)
	}
	return s.elector.Synced()
}

func (s *leaseSource) Snapshot() (topology.Snapshot, []clustermesh.Kubeconfig) {
	snap, kcs := s.Snapshotter.Snapshot()
	snap.Lease = s.elector.State()
	return snap, kcs
}

// healthSelf adds what the health probes saw to this node's facts.
type healthSelf struct {
	reconcile.SelfSource
	prober *health.Prober
}

func (h *healthSelf) Self(ctx context.Context) (topology.Self, error) {
	s, err := h.SelfSource.Self(ctx)
	s.Health = h.prober.Health()
	return s, err
}

// leavingSelf adds to this node's facts why it goes away, once known.
type leavingSelf struct {
	reconcile.SelfSource
	why *atomic.Pointer[string]
}

func (l *leavingSelf) Self(ctx context.Context) (topology.Self, error) {
	s, err := l.SelfSource.Self(ctx)
	if w := l.why.Load(); w != nil {
		s.Leaving = *w
	}
	return s, err
}

// followers hands every plan to each of the leadership parts.
type followers []reconcile.Leadership

func (fs followers) Follow(ctx context.Context, plan topology.Plan, applied bool, started time.Time) error {
	var errs []error
	for _, f := range fs {
		if err := f.Follow(ctx, plan, applied, started); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

type proberFollower struct{ p *health.Prober }

func (f proberFollower) Follow(_ context.Context, plan topology.Plan, _ bool, _ time.Time) error {
	f.p.Follow(plan)
	return nil
}

// plans hands every plan the loop reports to each of its sinks: the
// rejection sink, and with --metrics-compat=kilo the kilo_* series.
type plans []reconcile.RejectionSink

func (ps plans) Report(ctx context.Context, plan topology.Plan) {
	for _, p := range ps {
		p.Report(ctx, plan)
	}
}

// kiloSnapshots hands every snapshot to the kilo_* series: kg counts the
// cluster's Peers on every node (kilo_peers), and only the snapshot has
// them on a node that configures none.
type kiloSnapshots struct {
	reconcile.Snapshotter
	kilo *metrics.Kilo
}

func (s kiloSnapshots) Snapshot() (topology.Snapshot, []clustermesh.Kubeconfig) {
	snap, kcs := s.Snapshotter.Snapshot()
	s.kilo.Snapshot(snap)
	return snap, kcs
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
// When ctx ends while this node holds its location's Lease, the agent
// first hands the Lease over if its node is going away, or stretches it
// over the restart (stopping; docs/failover.md#restart).
func (a *Agent) Run(ctx context.Context) error {
	stop := ctx
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	// Events are written in the background, never in the loop's way.
	a.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.client.CoreV1().Events("")})
	defer a.events.Shutdown()
	a.secrets.Start(ctx)
	a.Remotes.Start(ctx)
	if a.meshStatus != nil {
		a.meshStatus.Start(ctx)
	}
	if a.elector != nil {
		a.elector.Start(ctx)
	}
	if a.prober != nil {
		go a.prober.Run(ctx)
	}
	a.Local.Start(ctx)
	go a.forward(ctx)
	regranted := make(chan []string, 1)
	if len(a.opts.Grants.Off()) > 0 {
		go a.watchGrants(ctx, regranted)
	}
	if !a.Local.WaitForSync(stop) {
		return stop.Err()
	}
	a.opts.Log.Info("local caches synced", "node", a.opts.Node)
	loop := make(chan error, 1)
	go func() { loop <- a.Loop.Run(ctx) }()
	select {
	case err := <-loop:
		return err
	case <-stop.Done():
		a.stopping(ctx)
		cancel()
		return <-loop
	case on := <-regranted:
		cancel()
		if err := <-loop; err != nil {
			a.opts.Log.Warn("reconcile loop ended with an error while restarting for new grants", "error", err)
		}
		return fmt.Errorf("%w: %s (the data plane stays as it is)", ErrRegranted, strings.Join(on, ", "))
	}
}

// ErrRegranted ends Run when grants were added that turn a feature on: the
// agent's container restarts and assembles itself with it.
var ErrRegranted = errors.New("RBAC grants added: restarting to turn on")

// GrantsRecheck is how often an agent with features off asks again.
const GrantsRecheck = 5 * time.Minute

// watchGrants asks again every GrantsRecheck which features the agent may
// use, and reports those turned on.
func (a *Agent) watchGrants(ctx context.Context, on chan<- []string) {
	t := a.opts.Clock.NewTicker(GrantsRecheck) // asked at start, by New
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		now, err := grants.Check(cctx, a.client, a.opts.Config.Namespace)
		cancel()
		if turned := grants.Changed(a.opts.Grants, now); err == nil && len(turned) > 0 {
			on <- turned
			return
		}
	}
}

// forward turns host events into loop runs.
func (a *Agent) forward(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.opts.HostEvents:
			a.Loop.NotifyNow(a.opts.Clock.Now())
		}
	}
}

// Status is this node's state now (`meshlet status`): the last plan, the
// device as read now with each peer's health, the host's drift from the
// plan, the remote watchers.
func (a *Agent) Status(ctx context.Context) status.Status {
	run, have := a.Loop.Last()
	in := status.Input{Node: a.opts.Node, Cluster: a.opts.Config.ClusterName, Version: a.opts.Version, Now: a.opts.Clock.Now(),
		Run: run, HaveRun: have, Ready: a.Loop.Ready(), Remotes: a.Remotes.Status(), FeaturesOff: a.opts.Grants.Off()}
	in.Device, in.DeviceErr = a.opts.WireGuard.Stats(ctx)
	if in.DeviceErr == nil {
		in.Health = a.peers.Health(in.Device.Peers)
	}
	if d, ok := a.opts.Host.(Drifter); ok && have {
		in.Drift, in.DriftErr = d.Drift(ctx, run.Plan)
	}
	in.Settings = a.opts.Config.Settings()
	in.Snapshot = topology.Snapshot{Nodes: a.Local.State(a.opts.Config.ClusterName).Nodes}
	if h, ok := a.opts.Host.(Sysctler); ok {
		in.IPForward, _ = h.Sysctl("net.ipv4.ip_forward")
	}
	if r, ok := a.opts.Host.(EndpointRouter); ok && in.DeviceErr == nil {
		var addrs []netip.Addr
		for _, p := range in.Device.Peers {
			if p.Endpoint.IsValid() {
				addrs = append(addrs, p.Endpoint.Addr().Unmap())
			}
		}
		in.EndpointRoutes, _ = r.EndpointRoutes(addrs) // nil: not read, and no finding relies on it
	}
	if a.prober != nil {
		for _, m := range a.prober.PathMTUs() {
			in.PathMTUs = append(in.PathMTUs, diagnose.PathMTU{Name: m.Name, Cluster: m.Cluster, Addr: m.Addr, MTU: m.MTU, Unanswered: m.Unanswered})
		}
		if lp := a.prober.LeaderPath(); lp != nil && lp.Probed {
			in.LeaderPath = &diagnose.LeaderPath{Leader: lp.Leader, Via: lp.Via, Direct: lp.Direct, Unanswered: lp.Unanswered, DirectAnswered: lp.DirectAnswered}
		}
	}
	if u, ok := a.opts.WireGuard.(Unresolver); ok {
		for _, e := range u.Unresolved() {
			in.Unresolved = append(in.Unresolved, diagnose.Unresolved{Peer: e.Name, Endpoint: e.Endpoint, Error: e.Error})
		}
	}
	if a.elector != nil {
		es := a.elector.Status()
		in.Leadership = &status.Leadership{Held: es.Held, TakesAt: es.TakesAt, RenewedAt: es.RenewedAt, Roles: []status.Role{}}
		for _, r := range es.Roles {
			in.Leadership.Roles = append(in.Leadership.Roles, status.Role{At: r.At, Leader: r.Leader})
		}
	}
	return status.Build(in)
}

// Serve exposes /metrics, /healthz, /readyz and kg's /health on addr until
// ctx ends; it returns the bound address (addr may use port 0). They say no
// more than kg's listener does; /status, which shows the node's routes,
// peers and remote clusters, is served only on the local socket
// (ServeStatus), and so are Go's profiles. kg's /graph is not served: it
// draws Peers' endpoints and remote clusters, what /status keeps off the
// network (docs/dropin.md#listener).
func (a *Agent) Serve(ctx context.Context, addr string) (string, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.opts.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	// kg's /health (Kilo's cmd/kg): 200 and no body while the process
	// serves, whatever the mesh's state; Kilo's e2e and users' probes call it.
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
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
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("listening on %s: %w", addr, err)
	}
	a.serve(ctx, ln, mux, "metrics server")
	return ln.Addr().String(), nil
}

// ServeStatus exposes /status on the unix socket path until ctx ends:
// mode 0600 in a directory it creates 0700, so only root on the node (or
// in the agent's container: kubectl exec, meshlet status --node) reads it
// (docs/security.md#status). The socket is removed when ctx ends.
func (a *Agent) ServeStatus(ctx context.Context, path string) error {
	mux := http.NewServeMux()
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(a.Status(ctx))
	})
	// Go's profiles (docs/performance.md#profiles): on this root-only
	// socket, never on the network listener.
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	ln, err := ListenUnix(path)
	if err != nil {
		return err
	}
	a.serve(ctx, ln, mux, "status server")
	return nil
}

// ErrStatusSocketTaken is ListenUnix's answer when something else holds the
// socket's path: another process serving it (a second agent on the node,
// which must not start) or a file that is not a socket (a wrong
// --status-socket). The caller refuses to start on it; other failures (a
// read-only directory) only cost the operator's /status.
var ErrStatusSocketTaken = errors.New("status socket path taken")

// ListenUnix listens on a unix socket at path, readable by its owner only:
// a missing directory is created 0700, the socket's own directory made
// 0700 (ownSocketDir), a stale socket (nobody answers on it) replaced.
func ListenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("status socket directory: %w", err)
	}
	if err := ownSocketDir(filepath.Dir(path), filepath.Base(path)); err != nil {
		return nil, fmt.Errorf("status socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%w: %s exists and is not a socket", ErrStatusSocketTaken, path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			_ = c.Close()
			return nil, fmt.Errorf("%w: another process serves %s (a second meshlet on this node? --status-socket sets the path)", ErrStatusSocketTaken, path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing the stale status socket: %w", err)
		}
	}
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("status socket mode: %w", err)
	}
	return ln, nil
}

// ownSocketDir makes dir, the directory of the socket called sock, 0700
// when it is the socket's own: a directory (not a symlink) of this
// process's user that holds nothing but the socket. The chart and the
// manifests mount an emptyDir at /run/meshlet, which kubelet creates 0777
// (docs/security.md#status says 0700). A directory shared with anything
// else (/run, /tmp, a --status-socket elsewhere) is left as it is: the
// socket's own mode, 0600, still keeps other users out, for connecting to
// a unix socket needs write permission on it.
func ownSocketDir(dir, sock string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || fi.Mode().Perm() == 0o700 && fi.Mode()&(os.ModeSticky|os.ModeSetgid|os.ModeSetuid) == 0 ||
		!ok || int(st.Uid) != os.Geteuid() {
		return nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() != sock {
			return nil
		}
	}
	return os.Chmod(dir, 0o700)
}

func (a *Agent) serve(ctx context.Context, ln net.Listener, h http.Handler, what string) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.opts.Log.Error(what, "error", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, c := context.WithTimeout(context.Background(), 2*time.Second)
		defer c()
		_ = srv.Shutdown(sctx) // a unix listener removes its socket on close
	}()
}
