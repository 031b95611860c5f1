// Package scale is meshlet's scale lane (`make bench-scale`, not part of
// `make test`): real kube-apiservers holding remote clusters of
// kubelet-sized Nodes (objects only) whose last-seen is refreshed at Kilo's
// rate, a local cluster, and the real `meshlet run` as a segment leader
// with a userspace device in a network namespace (e2e/harness). It
// reports, for the leader: CPU and whole-process RSS idle and under the
// heartbeat churn, GC and allocations, the convergence of remote changes
// injected under the churn (API write → device written, and
// meshlet_convergence_seconds), the watches on every API server and the
// device's peers. Figures are reported (RESULT lines), never asserted.
//
// The size comes from the environment (defaults in brackets):
// SCALE_CLUSTERS [10] remote clusters of SCALE_NODES [1000] Nodes in
// SCALE_LOCATIONS [100] locations each (one remote leader, so one device
// peer, per location), a heartbeat per node every SCALE_HEARTBEAT [30s].
// Phases: idle (no API activity, after every remote node was beaten once)
// for SCALE_IDLE [40s; at most what Kilo's 60 s window leaves after that
// sweep]; heartbeats alone
// for SCALE_CHURN [120s]; heartbeats and a remote change every
// SCALE_CHANGE [2s] for SCALE_CHURN again. With SCALE_PIN [1] the leader
// and its device run alone on the last CPU, everything else on the others
// (cgroup v1 cpusets; SCALE_PIN=0: unpinned). With SCALE_PROFILE=dir the
// leader's CPU profile of each phase is saved there (<phase>.cpu.pprof) with
// its allocation profiles at the phase's start and end (<phase>.allocs-0 and
// -1.pprof: `go tool pprof -sample_index=alloc_objects -base ...-0.pprof
// ...-1.pprof` is the phase's allocations). Every remote cluster has its
// own API server and etcd: Nodes are cluster-scoped, so clusters cannot
// share one.
package scale

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/apiserver"
	"github.com/meshlet/meshlet/e2e/harness"
)

type config struct {
	clusters, nodes, locations int
	heartbeat, idle, churn     time.Duration
	change                     time.Duration
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration", name, v)
	}
	return d
}

func report(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Logf("RESULT "+format, args...)
}

func TestScale(t *testing.T) {
	if os.Getenv("MESHLET_SCALE") == "" || os.Getenv("MESHLET_BIN") == "" {
		t.Skip("the scale lane runs from `make bench-scale`")
	}
	if os.Geteuid() != 0 {
		apiserver.SkipOrFail(t, "scale: needs root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		apiserver.SkipOrFail(t, "scale: ip not installed (apt-get install iproute2)")
	}
	cfg := config{
		clusters: envInt(t, "SCALE_CLUSTERS", 10), nodes: envInt(t, "SCALE_NODES", 1000),
		locations: envInt(t, "SCALE_LOCATIONS", 100), heartbeat: envDuration(t, "SCALE_HEARTBEAT", 30*time.Second),
		idle: envDuration(t, "SCALE_IDLE", 40*time.Second), churn: envDuration(t, "SCALE_CHURN", 120*time.Second),
		change: envDuration(t, "SCALE_CHANGE", 2*time.Second),
	}
	cfg.locations = min(cfg.locations, cfg.nodes)
	if cfg.nodes > 1000 || cfg.clusters > 60 || cfg.locations > 1000 {
		t.Fatalf("at most 60 clusters of 1000 nodes in 1000 locations (the address plan)")
	}
	ctx := context.Background()
	env, err := harness.New(harness.Options{Logf: t.Logf, ResyncPeriod: 30 * time.Second, LogLevel: "info",
		KeepDir: os.Getenv("E2E_KEEP") != ""})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Close)

	// Clusters: one API server and etcd each.
	start := time.Now()
	local, err := env.AddCluster(ctx, harness.ClusterSpec{Name: "local",
		PodNet: netip.MustParsePrefix("10.1.0.0/16"), WGSubnet: netip.MustParsePrefix("100.64.0.0/16")})
	if err != nil {
		t.Fatal(err)
	}
	all := []*harness.Cluster{local}
	var remotes []*harness.Cluster
	for c := 1; c <= cfg.clusters; c++ {
		rc, err := env.AddCluster(ctx, harness.ClusterSpec{Name: fmt.Sprintf("remote-%02d", c),
			PodNet:   netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + c), 0, 0}), 16),
			WGSubnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{100, byte(64 + c), 0, 0}), 16)})
		if err != nil {
			t.Fatalf("API server %d of %d: %v", c+1, cfg.clusters+1, err)
		}
		remotes = append(remotes, rc)
		all = append(all, rc)
	}
	if err := env.ApplyMesh(ctx, "mesh", all...); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d API servers up in %v", len(all), time.Since(start).Round(time.Second))

	// Remote Nodes, all clusters at once.
	start = time.Now()
	names := make([][]string, len(remotes))
	var wg sync.WaitGroup
	errs := make([]error, len(remotes))
	for ci, rc := range remotes {
		keys := make([]string, cfg.nodes)
		for i := range keys {
			_, keys[i] = harness.NewKeyPair()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			names[ci], errs[ci] = createRemoteNodes(ctx, rc, ci+1, cfg.nodes, cfg.locations, keys)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d remote Nodes created in %v", cfg.clusters*cfg.nodes, time.Since(start).Round(time.Second))
	baseline := map[string]map[string]int{}
	for _, rc := range remotes {
		w, err := watches(ctx, rc.Admin)
		if err != nil {
			t.Fatal(err)
		}
		baseline[rc.Name] = w
	}

	// The local cluster: a leader and a non-leader (location l; the first
	// by name leads). Only leaders watch the remote clusters.
	leader, err := local.AddNode(ctx, harness.NodeSpec{Name: "l-1", Location: "l"})
	if err != nil {
		t.Fatal(err)
	}
	follower, err := local.AddNode(ctx, harness.NodeSpec{Name: "l-2", Location: "l"})
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := harness.StartAll(ctx, leader, follower); err != nil {
		t.Fatal(err)
	}
	wantPeers := cfg.clusters * cfg.locations
	err = harness.Poll(ctx, 20*time.Minute, time.Second, "the leader synced with every remote cluster", func() (bool, error) {
		m, err := leader.Metrics(ctx)
		if err != nil {
			return false, err
		}
		for _, rc := range remotes {
			if n, _ := m.Value("meshlet_remote_cluster_nodes", "cluster", rc.Name); int(n) != cfg.nodes {
				return false, fmt.Errorf("%s: %v nodes known", rc.Name, n)
			}
		}
		if p, _ := m.Value("meshlet_peers", "kind", "remote"); int(p) != wantPeers {
			return false, fmt.Errorf("%v remote peers planned, want %d", p, wantPeers)
		}
		d, err := leader.Device()
		if err != nil || d == nil {
			return false, fmt.Errorf("device: %v", err)
		}
		return len(d.Peers) == wantPeers, fmt.Errorf("%d device peers, want %d", len(d.Peers), wantPeers)
	})
	if err != nil {
		t.Fatal(err)
	}
	synced := time.Since(start)
	pid, dev := leader.PID(), devicePID(leader)
	if pid == 0 || dev == 0 {
		t.Fatalf("leader pid %d, device pid %d", pid, dev)
	}
	t.Logf("leader synced %d remote nodes, %d device peers, in %v", cfg.clusters*cfg.nodes, wantPeers, synced.Round(time.Second))
	var pinned *pinning
	if os.Getenv("SCALE_PIN") != "0" {
		rest := []int{os.Getpid(), follower.PID(), devicePID(follower)}
		for _, c := range all {
			a, e := serverPIDs(c)
			rest = append(append(rest, a...), e...)
		}
		if pinned, err = pin([]int{pid, dev}, rest); err != nil {
			t.Fatalf("pinning the leader to a CPU of its own (SCALE_PIN=0 runs without): %v", err)
		}
		t.Cleanup(pinned.undo)
		t.Logf("pinned: %s", pinned)
	}

	// Settle (the initial lists' garbage, the first resync), then idle:
	// every remote node beaten once, so none ages out of Kilo's window
	// (judged by when the leader heard its last-seen change) while the
	// phase lasts — at most what is left of a minute after the sweep.
	if err := wait(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	clients := make([]kubernetes.Interface, len(remotes))
	for ci, rc := range remotes {
		if clients[ci], err = kubernetes.NewForConfig(rc.RestConfig()); err != nil {
			t.Fatal(err)
		}
	}
	start = time.Now()
	swept := &heartbeats{}
	for ci := range remotes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			swept.sweep(ctx, clients[ci], names[ci], 8)
		}()
	}
	wg.Wait()
	sweepTook := time.Since(start)
	idleFor := cfg.idle
	if left := topology.ReadyWindow - 5*time.Second - sweepTook; idleFor > left {
		idleFor = left
	}
	if idleFor < 10*time.Second {
		t.Fatalf("the sweep of every remote node took %v: no idle phase fits in Kilo's window", sweepTook)
	}
	before, err := leader.Device()
	if err != nil || before == nil {
		t.Fatalf("reading the leader's device: %v", err)
	}
	idle, err := measure(ctx, t, "idle", leader, dev, idleFor, nil)
	if err != nil {
		t.Fatal(err)
	}
	after, err := leader.Device()
	if err != nil || after == nil {
		t.Fatalf("reading the leader's device: %v", err)
	}

	// Heartbeats from every remote node at the configured rate: the
	// steady state of a real mesh. Then, with them, a remote leader's
	// endpoint changed every cfg.change.
	churnCtx, stopChurn := context.WithCancel(ctx)
	beats := make([]*heartbeats, len(remotes))
	var beating sync.WaitGroup
	for ci := range remotes {
		beats[ci] = &heartbeats{}
		beating.Add(1)
		go func() {
			defer beating.Done()
			beats[ci].drive(churnCtx, clients[ci], names[ci], cfg.heartbeat, 4)
		}()
	}
	// Ramp up, not measured: a heartbeat period and more, so every
	// remote node has beaten once (nodes that aged out in the idle phase
	// come back) and the phase measures the steady state.
	if err := wait(ctx, cfg.heartbeat+10*time.Second); err != nil {
		t.Fatal(err)
	}
	sentBefore := sentSum(beats)
	servers := serverSamples(remotes)
	driver := take(os.Getpid())
	hb, err := measure(ctx, t, "heartbeats", leader, dev, cfg.churn, nil)
	if err != nil {
		t.Fatal(err)
	}
	beatsSent := float64(sentSum(beats) - sentBefore)
	beatRate := beatsSent / hb.took.Seconds()
	driverShare := share(driver, take(os.Getpid()))
	apiShare, apiRSS, etcdRSS := servers.done()
	var changes []change
	withChanges, err := measure(ctx, t, "changes", leader, dev, cfg.churn, func(ctx context.Context) {
		changes = injectChanges(ctx, t, remotes, cfg)
	})
	if err != nil {
		t.Fatal(err)
	}
	var dropped, failed int64
	for _, b := range beats {
		dropped += b.dropped.Load()
		failed += b.failed.Load()
	}
	perWatch := map[string]string{}
	for _, rc := range remotes {
		w, err := watches(ctx, rc.Admin)
		if err != nil {
			t.Fatal(err)
		}
		b := baseline[rc.Name]
		perWatch[rc.Name] = fmt.Sprintf("nodes %d, peers %d open; %d node and %d peer watch requests since meshlet started",
			w["nodes"]-b["nodes"], w["peers"]-b["peers"], w["requests:nodes"]-b["requests:nodes"], w["requests:peers"]-b["requests:peers"])
	}
	stopChurn()
	beating.Wait()

	lat, missing := convergence(t, leader.LogPath, changes)
	d, err := leader.Device()
	if err != nil || d == nil {
		t.Fatalf("reading the leader's device: %v", err)
	}

	report(t, "scale: %d remote clusters × %d Nodes (kubelet-sized) in %d locations each, %d API servers; leader l-1 + non-leader l-2; %s",
		cfg.clusters, cfg.nodes, cfg.locations, len(all), pinned)
	report(t, "leader synced in %v; device peers %d (planned remote peers %d)", synced.Round(time.Second), len(d.Peers), wantPeers)
	report(t, "idle %v (after every remote node beaten once in %v: %d beats, %d failed): leader CPU %.3f%% of a core, device process %.3f%%; RSS %.0f MiB (device process %.0f MiB); %.1f GC/min, %.2f MB/s allocated, %.0f reconciles; device peers %d → %d",
		idle.took.Round(time.Second), sweepTook.Round(100*time.Millisecond), swept.sent.Load(), swept.failed.Load(), idle.cpu, idle.devCPU, idle.rssMax, idle.devRSS,
		idle.gcPerMin, idle.allocMBs, idle.reconciles, len(before.Peers), len(after.Peers))
	report(t, "heartbeats %v: %.0f/s reached (target %.0f/s; %d dropped by the driver, %d failed over the run); leader CPU %.2f%% of a core, device process %.3f%%; RSS max %.0f MiB; %.1f GC/min, %.2f MB/s allocated, %.0f mallocs/s, %.0f reconciles",
		hb.took.Round(time.Second), beatRate, float64(cfg.clusters*cfg.nodes)/cfg.heartbeat.Seconds(), dropped, failed,
		hb.cpu, hb.devCPU, hb.rssMax, hb.gcPerMin, hb.allocMBs, hb.mallocsPerS, hb.reconciles)
	report(t, "heartbeats + a remote change every %v, %v: leader CPU %.2f%% of a core, device process %.3f%%; RSS max %.0f MiB; %.1f GC/min, %.2f MB/s allocated, %.0f reconciles",
		cfg.change, withChanges.took.Round(time.Second), withChanges.cpu, withChanges.devCPU, withChanges.rssMax, withChanges.gcPerMin,
		withChanges.allocMBs, withChanges.reconciles)
	// Per event: what a phase cost beyond the phase before it (idle, then
	// heartbeats alone), over its events.
	perBeat := hb.beyond(idle, beatsSent)
	perChange := withChanges.beyond(hb, float64(len(changes)))
	report(t, "per remote heartbeat (%0.f in %v, beyond idle): leader CPU %.1f µs, %.1f mallocs, %.2f kB allocated; per remote change (%d, beyond the heartbeats): leader CPU %.0f µs, %.0f mallocs, %.1f kB allocated",
		beatsSent, hb.took.Round(time.Second), perBeat.cpuMicros, perBeat.mallocs, perBeat.allocKB,
		len(changes), perChange.cpuMicros, perChange.mallocs, perChange.allocKB)
	report(t, "remote changes under the heartbeats: %d injected, %d not seen; API write → device written p50 %v, p99 %v, max %v; meshlet_convergence_seconds (watch event → data plane) p50≈%.3fs p99≈%.3fs",
		len(changes), missing, percentile(lat, 0.5).Round(time.Millisecond), percentile(lat, 0.99).Round(time.Millisecond),
		percentile(lat, 1).Round(time.Millisecond), withChanges.convP50, withChanges.convP99)
	for _, rc := range remotes {
		report(t, "watches opened by meshlet on %s: %s", rc.Name, perWatch[rc.Name])
	}
	report(t, "API servers under the heartbeats: %d kube-apiservers + etcds used %.0f%% of a core together; RSS %.0f MiB per kube-apiserver, %.0f MiB per etcd (mean); the driver and forwarders (test process) %.0f%%",
		len(remotes), apiShare, apiRSS, etcdRSS, driverShare)
}

func wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func sentSum(bs []*heartbeats) int64 {
	var n int64
	for _, b := range bs {
		n += b.sent.Load()
	}
	return n
}

// phase is what the leader used over one measured period.
type phase struct {
	took                    time.Duration
	cpuTime                 time.Duration // the agent's, all threads
	mallocsTotal, allocated float64       // over the phase
	cpu, devCPU             float64       // % of one core
	rssMax, devRSS          float64       // MiB
	gcPerMin, allocMBs      float64
	mallocsPerS, reconciles float64
	convP50, convP99        float64
}

// measure samples the leader (and its device process) over d while during
// runs (nil: idle), and profiles it under SCALE_PROFILE.
func measure(ctx context.Context, t *testing.T, name string, leader *harness.Node, dev int, d time.Duration, during func(ctx context.Context)) (phase, error) {
	var p phase
	pid := leader.PID()
	prof := profiler(ctx, t, leader, name, d)
	defer prof()
	m0, err := leader.Metrics(ctx)
	if err != nil {
		return p, err
	}
	g0 := readGoStats(m0)
	c0, dv0 := take(pid), take(dev)
	pctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if during != nil {
			during(pctx)
		}
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
sampling:
	for {
		p.rssMax = max(p.rssMax, rssMiB(pid))
		select {
		case <-pctx.Done():
			break sampling
		case <-tick.C:
		}
	}
	<-done
	c1, dv1 := take(pid), take(dev)
	m1, err := leader.Metrics(ctx)
	if err != nil {
		return p, err
	}
	g1 := readGoStats(m1)
	p.took = c1.at.Sub(c0.at)
	p.cpu, p.devCPU = share(c0, c1), share(dv0, dv1)
	p.cpuTime = c1.cpu - c0.cpu
	p.mallocsTotal, p.allocated = g1.mallocs-g0.mallocs, g1.allocBytes-g0.allocBytes
	p.devRSS = rssMiB(dev)
	p.gcPerMin = (g1.gcCycles - g0.gcCycles) / p.took.Minutes()
	p.allocMBs = (g1.allocBytes - g0.allocBytes) / 1e6 / p.took.Seconds()
	p.mallocsPerS = (g1.mallocs - g0.mallocs) / p.took.Seconds()
	p.reconciles = g1.reconciles - g0.reconciles
	if a, b := m1.Series("meshlet_convergence_seconds"), m0.Series("meshlet_convergence_seconds"); len(a) == 1 && len(b) == 1 {
		h := harness.HistogramDelta(b[0], a[0])
		p.convP50, p.convP99 = harness.HistogramQuantile(h, 0.5), harness.HistogramQuantile(h, 0.99)
	}
	return p, nil
}

// profiler saves, under SCALE_PROFILE, the leader's allocations now and
// its CPU profile over d; the function it returns waits for the CPU profile
// and saves the allocations again.
func profiler(ctx context.Context, t *testing.T, leader *harness.Node, name string, d time.Duration) func() {
	dir := os.Getenv("SCALE_PROFILE")
	if dir == "" {
		return func() {}
	}
	save := func(file, what string, d time.Duration) {
		b, err := leader.Profile(ctx, what, d)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, file), b, 0o644)
		}
		if err != nil {
			t.Errorf("profile %s: %v", file, err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	save(name+".allocs-0.pprof", "allocs", 0)
	done := make(chan struct{})
	go func() {
		defer close(done)
		save(name+".cpu.pprof", fmt.Sprintf("profile?seconds=%d", int(d.Seconds())), d)
	}()
	return func() {
		<-done
		save(name+".allocs-1.pprof", "allocs", 0)
	}
}

// eventCost is what one event cost the leader's agent.
type eventCost struct {
	cpuMicros, mallocs, allocKB float64
}

// beyond is p's cost over what base's rates would have cost in p's
// time, per one of events.
func (p phase) beyond(base phase, events float64) eventCost {
	if events <= 0 {
		return eventCost{}
	}
	scale := p.took.Seconds() / base.took.Seconds()
	return eventCost{
		cpuMicros: (float64(p.cpuTime) - scale*float64(base.cpuTime)) / 1e3 / events,
		mallocs:   (p.mallocsTotal - scale*base.mallocsTotal) / events,
		allocKB:   (p.allocated - scale*base.allocated) / 1e3 / events,
	}
}

// change is one remote change injected: a remote leader's endpoint.
type change struct {
	peer string
	at   time.Time
}

// injectChanges moves a remote leader's endpoint every cfg.change (round
// robin over clusters and locations) until ctx ends.
func injectChanges(ctx context.Context, t *testing.T, remotes []*harness.Cluster, cfg config) []change {
	var out []change
	tick := time.NewTicker(cfg.change)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
		ci, loc := i%len(remotes), (i/len(remotes))%cfg.locations
		port := 51821 + (i/len(remotes)/cfg.locations)%2 // every visit moves it
		ep := remoteEndpoint(ci+1, loc, port)
		name := nodeName(ci+1, loc)
		at := time.Now()
		if err := remotes[ci].PatchNodeAnnotations(ctx, name, map[string]*string{topology.AnnotationClusterMeshEndpoint: &ep}); err != nil {
			// A patch the phase's end cuts short (ctx done, or its client's
			// rate limiter refusing to wait past the deadline) is not one.
			if dl, _ := ctx.Deadline(); ctx.Err() == nil && time.Until(dl) > time.Second {
				t.Errorf("change %d: %v", i, err)
			}
			continue
		}
		out = append(out, change{peer: name, at: at})
	}
}

// convergence finds, in the leader's log, when each change reached the
// device: the first "wireguard peers applied" line after the write that
// updated the peer (logged right after the device was written).
func convergence(t *testing.T, logPath string, changes []change) (lat []time.Duration, missing int) {
	f, err := os.Open(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type applied struct {
		at    time.Time
		peers []string
	}
	var applies []applied
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !strings.Contains(string(line), `"wireguard peers applied"`) {
			continue
		}
		var l struct {
			Time    time.Time `json:"time"`
			Updated []string  `json:"updated"`
		}
		if json.Unmarshal(line, &l) == nil {
			applies = append(applies, applied{l.Time, l.Updated})
		}
	}
	for _, c := range changes {
		found := false
		for _, a := range applies {
			if a.at.Before(c.at) {
				continue
			}
			for _, p := range a.peers {
				if p == c.peer {
					found = true
					break
				}
			}
			if found {
				lat = append(lat, a.at.Sub(c.at))
				break
			}
		}
		if !found {
			missing++
		}
	}
	return lat, missing
}

// servers samples the remote API servers' CPU over the churn.
type servers struct {
	pids []int
	at   []sample
}

func serverSamples(remotes []*harness.Cluster) *servers {
	s := &servers{}
	for _, rc := range remotes {
		a, e := serverPIDs(rc)
		s.pids = append(s.pids, a...)
		s.pids = append(s.pids, e...)
	}
	for _, p := range s.pids {
		s.at = append(s.at, take(p))
	}
	return s
}

// done returns their CPU (% of a core, all together) and mean RSS of a
// kube-apiserver and of an etcd (MiB).
func (s *servers) done() (cpu, apiRSS, etcdRSS float64) {
	var na, ne int
	for i, p := range s.pids {
		cpu += share(s.at[i], take(p))
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		if strings.Contains(string(b), "kube-apiserver") {
			apiRSS += rssMiB(p)
			na++
		} else {
			etcdRSS += rssMiB(p)
			ne++
		}
	}
	return cpu, apiRSS / float64(max(na, 1)), etcdRSS / float64(max(ne, 1))
}
