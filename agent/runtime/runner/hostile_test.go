package runner_test

// Hostile input against real API servers (docs/security.md#hostile-input):
// the agent of a-1 meshes a local cluster and two remote ones, one of them
// hostile; then a Peer with 100,000 allowedIPs, a flood of Peers, an
// allowed-location-ips annotation as large as the API server takes and a
// 1 MiB one arrive. Every limit rejects with an Event and a metric, and
// the ordinary peers never leave the device. MESHLET_HOSTILE=1 runs it at
// full size (50,000 remote Nodes, 10,000 Peers, default limits: minutes of
// object creation); make test runs it small, with small limits.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/agent/runtime/reconcile"
	"github.com/meshlet/meshlet/agent/runtime/runner"
	"github.com/meshlet/meshlet/e2e/apiserver"
	"github.com/meshlet/meshlet/wg"
)

// watchWG keeps only the last device (a device of thousands of peers per
// apply would make the test's own memory the measurement) and counts the
// applies, after arm, that lack one of the peers that must stay.
type watchWG struct {
	mu    sync.Mutex
	last  topology.Device
	n     int
	must  []string
	armed bool
	lost  []string
	wake  chan struct{}
}

func (f *watchWG) ActOnSessions(context.Context, *topology.SessionActions) error { return nil }
func (f *watchWG) InitiateHandshakes(context.Context) (int, error)               { return 0, nil }
func (f *watchWG) Stats(context.Context) (wg.DeviceStats, error)                 { return wg.DeviceStats{}, nil }

func (f *watchWG) Apply(_ context.Context, d topology.Device) (reconcile.Changes, error) {
	f.mu.Lock()
	f.last, f.n = d, f.n+1
	if f.armed {
		for _, name := range f.must {
			if _, ok := peerNamed(d, name); !ok {
				f.lost = append(f.lost, fmt.Sprintf("apply %d lacks %s", f.n, name))
			}
		}
	}
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
	return nil, nil
}

// waitFor waits until the last device satisfies ok.
func (f *watchWG) waitFor(t *testing.T, timeout time.Duration, what string, ok func(topology.Device) bool) topology.Device {
	t.Helper()
	deadline := time.After(timeout)
	for {
		f.mu.Lock()
		d, n := f.last, f.n
		f.mu.Unlock()
		if n > 0 && ok(d) {
			return d
		}
		select {
		case <-f.wake:
		case <-deadline:
			t.Fatalf("timed out after %v waiting for %s; last device has %d peers", timeout, what, len(d.Peers))
		}
	}
}

func (f *watchWG) arm() { f.mu.Lock(); f.armed = true; f.mu.Unlock() }

// hostileNode is node i of the hostile cluster: its own location (one
// segment each) and a WireGuard IP, pods in 10.128.0.0/11, WireGuard IPs
// in 10.160.0.0/11.
func hostileNode(i int) *corev1.Node {
	a := func(v int) string {
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
	}
	k := key(0)
	k[1], k[2], k[3] = byte(i>>16), byte(i>>8), byte(i)
	return node(fmt.Sprintf("h-%05d", i), fmt.Sprintf("site-%05d", i), a(172<<24|20<<16+i)+"/12", a(10<<24|128<<16+i*16)+"/28", k,
		map[string]string{topology.AnnotationWireGuardIP: a(10<<24|160<<16+i) + "/11"})
}

// compactAllowedIPs returns n distinct IPv6 prefixes in few bytes
// ("1::/16", "1::/17", …), so that as many as possible fit in etcd's
// 1.5 MiB request limit.
func compactAllowedIPs(n int) []string {
	out := make([]string, 0, n)
	for bits := 16; len(out) < n; bits++ {
		for h := 1; h <= 0xffff && len(out) < n; h++ {
			out = append(out, fmt.Sprintf("%x::/%d", h, bits))
		}
	}
	return out
}

func createPeer(ctx context.Context, rc rest.Interface, name string, allowed []string, k topology.Key) error {
	b, err := json.Marshal(&kilo.Peer{TypeMeta: metav1.TypeMeta{APIVersion: "kilo.squat.ai/v1alpha1", Kind: "Peer"},
		ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: kilo.PeerSpec{AllowedIPs: allowed, PublicKey: k.String()}})
	if err != nil {
		return err
	}
	return rc.Post().Resource("peers").Body(b).Do(ctx).Error()
}

// parallel runs fn(0..n-1) on 16 workers and fails t on the first error.
func parallel(t *testing.T, n int, fn func(i int) error) time.Duration {
	t.Helper()
	start := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Value
	work := make(chan int)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := fn(i); err != nil {
					failed.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

func liveHeapMiB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapInuse) / (1 << 20)
}

func processRSSMiB() float64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return 0
			}
			return kb / 1024
		}
	}
	return 0
}

// reconcileSeconds returns meshlet_reconcile_duration_seconds' count and
// sum (a plan and its application to the fake data plane).
func reconcileSeconds(t *testing.T, a *runner.Agent) (uint64, float64) {
	var m dto.Metric
	if err := a.Metrics.ReconcileDuration.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

func TestHostileInputAgainstRealAPIServers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three kube-apiservers")
	}
	full := os.Getenv("MESHLET_HOSTILE") != ""
	size := struct {
		remoteNodes, floodPeers int
		limits                  kilo.Limits
	}{30, 30, kilo.Limits{PeerAllowedIPs: 1000, AllowedLocationIPs: 1000, Peers: 20, RemoteNodes: 20}}
	if full {
		size.remoteNodes, size.floodPeers, size.limits = 50000, 10000, kilo.DefaultLimits
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	local := apiserver.Start(t, apiserver.Options{})
	good := apiserver.Start(t, apiserver.Options{})
	hostile := apiserver.Start(t, apiserver.Options{})
	applyFiles(t, local.AdminConfig(), "manifests/namespace/namespace.yaml", "manifests/crds/peers.kilo.squat.ai.yaml",
		"manifests/crds/clustermeshes.kilo.squat.ai.yaml", "manifests/base/rbac.yaml")
	// The Secrets its ClusterMeshes name, by name (the base grants none).
	grantSecrets(t, local, "good-kubeconfig", "hostile-kubeconfig")
	for _, r := range []*apiserver.Server{good, hostile} {
		applyFiles(t, r.AdminConfig(), "manifests/remote/namespace.yaml", "manifests/crds/peers.kilo.squat.ai.yaml", "manifests/remote/rbac.yaml")
	}
	ladmin := kubernetes.NewForConfigOrDie(local.AdminConfig())
	lkilo, err := cluster.KiloClient(local.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}

	// The hostile cluster announces its nodes before the agent starts.
	hadmin := kubernetes.NewForConfigOrDie(hostile.AdminConfig())
	took := parallel(t, size.remoteNodes, func(i int) error {
		_, err := hadmin.CoreV1().Nodes().Create(ctx, hostileNode(i), metav1.CreateOptions{})
		return err
	})
	t.Logf("created %d hostile remote Nodes in %v", size.remoteNodes, took.Round(time.Millisecond))
	gadmin := kubernetes.NewForConfigOrDie(good.AdminConfig())
	for _, n := range []*corev1.Node{
		node("b-1", "z", "172.16.0.1/24", "10.2.1.0/24", key(11), map[string]string{topology.AnnotationWireGuardIP: "100.66.1.1/24"}),
		node("a-1", "x", "192.168.1.1/24", "10.244.1.0/24", key(1), nil),
		node("a-2", "y", "192.168.2.1/24", "10.244.2.0/24", key(2), nil),
	} {
		cs := ladmin
		if n.Name == "b-1" {
			cs = gadmin
		}
		if _, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	go keepFresh(ctx, gadmin, "b-1")
	go keepFresh(ctx, ladmin, "a-2")
	if err := createPeer(ctx, lkilo, "laptop", []string{"10.5.0.1/32"}, key(50)); err != nil {
		t.Fatal(err)
	}
	remoteKubeconfig(ctx, t, ladmin, good, "good-kubeconfig")
	remoteKubeconfig(ctx, t, ladmin, hostile, "hostile-kubeconfig")
	mesh := []byte(`
apiVersion: kilo.squat.ai/v1alpha1
kind: ClusterMesh
metadata: {name: prod, namespace: kilo-system}
spec:
  clusters:
  - name: home
    local: true
    allowedNetworks: [10.244.0.0/16, 10.5.0.0/16, 10.4.0.0/24]
  - name: good
    kubeconfigSecretRef: {name: good-kubeconfig, key: kubeconfig}
    allowedNetworks: [10.2.0.0/16, 100.66.1.0/24]
  - name: hostile
    kubeconfigSecretRef: {name: hostile-kubeconfig, key: kubeconfig}
    allowedNetworks: [10.128.0.0/11, 10.160.0.0/11]
`)
	if _, err := apiserver.Apply(ctx, local.AdminConfig(), mesh, apiserver.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}

	cfg := agentConfig()
	cfg.MaxPeerAllowedIPs, cfg.MaxAllowedLocationIPs, cfg.MaxPeers, cfg.MaxRemoteNodes =
		size.limits.PeerAllowedIPs, size.limits.AllowedLocationIPs, size.limits.Peers, size.limits.RemoteNodes
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	dev := &watchWG{wake: make(chan struct{}, 1), must: []string{"laptop", "b-1", "a-2"}}
	heapBefore := liveHeapMiB()
	agent, err := runner.New(a1Options(cfg, local.AdminConfig(), dev, slog.LevelWarn))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- agent.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	// kinds counts the device's peers by kind, and the hostile cluster's.
	kinds := func(d topology.Device) (peers, hostileLeaders int) {
		for _, p := range d.Peers {
			switch {
			case p.Kind == topology.KindPeer:
				peers++
			case p.Cluster == "hostile":
				hostileLeaders++
			}
		}
		return peers, hostileLeaders
	}
	d := dev.waitFor(t, 5*time.Minute, "laptop, b-1, a-2 and the hostile cluster's oldest segments", func(d topology.Device) bool {
		_, h := kinds(d)
		_, l := peerNamed(d, "laptop")
		_, b := peerNamed(d, "b-1")
		return l && b && h == size.limits.RemoteNodes
	})
	synced := time.Since(start)
	dev.arm()
	if _, ok := peerNamed(d, "h-00000"); !ok {
		t.Errorf("the hostile cluster's oldest node h-00000 is not meshed")
	}
	heapSynced, rssSynced := liveHeapMiB()-heapBefore, processRSSMiB()

	t.Run("the API server refuses a 1 MiB annotation and takes 256 KiB in all", func(t *testing.T) {
		big := strings.Repeat("x", 1<<20)
		_, err := ladmin.CoreV1().Nodes().Create(ctx, node("huge-annotation", "x", "192.168.9.1/24", "10.244.9.0/24", key(9),
			map[string]string{"example.com/blob": big}), metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), "262144") {
			t.Errorf("a Node with a 1 MiB annotation: %v, want refused at 262144 bytes", err)
		}
		peer := fmt.Sprintf(`{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"huge-annotation","annotations":{%q:%q}},"spec":{"allowedIPs":["10.5.9.1/32"],"publicKey":%q}}`,
			topology.AnnotationNodePersistentKeepalive, big, key(51).String())
		if err := lkilo.Post().Resource("peers").Body([]byte(peer)).Do(ctx).Error(); err == nil || !strings.Contains(err.Error(), "262144") {
			t.Errorf("a Peer with a 1 MiB annotation: %v, want refused at 262144 bytes", err)
		}
		// a-2's allowed-location-ips as large as the budget allows (the
		// other annotations take the rest): over --max-allowed-location-ips.
		var b strings.Builder
		for i := 0; b.Len() < 250<<10; i++ {
			fmt.Fprintf(&b, "192.168.%d.%d/32,", i>>8&0xff, i&0xff)
		}
		patchAnnotations(t, ladmin, "a-2", map[string]string{topology.AnnotationAllowedLocationIPs: strings.TrimSuffix(b.String(), ",")})
	})

	t.Run("a Peer with 100,000 allowedIPs", func(t *testing.T) {
		ips := compactAllowedIPs(100000)
		raw, _ := json.Marshal(ips)
		err := createPeer(ctx, lkilo, "huge", ips, key(52))
		t.Logf("RESULT hostile: a Peer with 100,000 allowedIPs (%d KiB of JSON): API server says %v", len(raw)>>10, err)
		if err != nil {
			t.Fatal(err) // etcd takes it: the limit, not etcd, has to stop it
		}
	})

	// The flood: Peers created after laptop (a second later: creation
	// times have whole seconds).
	time.Sleep(1100 * time.Millisecond)
	took = parallel(t, size.floodPeers, func(i int) error {
		k := key(0)
		k[1], k[2], k[3] = 0x77, byte(i>>8), byte(i)
		return createPeer(ctx, lkilo, fmt.Sprintf("flood-%05d", i), []string{fmt.Sprintf("10.5.%d.%d/32", 100+i>>8, i&0xff)}, k)
	})
	t.Logf("created %d flood Peers in %v", size.floodPeers, took.Round(time.Millisecond))

	// laptop is the oldest Peer: it and the next limit-1 are planned.
	d = dev.waitFor(t, 2*time.Minute, fmt.Sprintf("%d Peers planned", size.limits.Peers), func(d topology.Device) bool {
		p, _ := kinds(d)
		return p == size.limits.Peers
	})
	if _, ok := peerNamed(d, "huge"); ok {
		t.Error("the Peer with 100,000 allowedIPs is planned")
	}

	t.Run("one Event and one active rejection per limit", func(t *testing.T) {
		want := map[string]string{ // involved object → field of the LimitExceeded Event
			"Node/a-2":         topology.AnnotationAllowedLocationIPs,
			"Peer/huge":        "spec.allowedIPs",
			"Peer/flood-":      "",
			"ClusterMesh/prod": "",
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			evs, err := ladmin.CoreV1().Events("").List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			// Event objects per involved object, and their counts. The
			// flood's rejection is on the oldest Peer left out, which may
			// move while the Peers, created in parallel, arrive (a Peer
			// created earlier can arrive later): one Event for each object
			// it lands on is the contract, not one for the whole flood.
			events := map[string]int{}
			counts := map[string]int32{}
			for _, e := range evs.Items {
				if e.Reason != string(topology.ReasonLimitExceeded) {
					continue
				}
				object := e.InvolvedObject.Kind + "/" + e.InvolvedObject.Name
				events[object]++
				counts[object] += max(e.Count, 1)
				name := object
				if strings.HasPrefix(name, "Peer/flood-") {
					name = "Peer/flood-"
				}
				field, _, _ := strings.Cut(e.Message, ":")
				if !strings.HasPrefix(field, "kilo.squat.ai/") && !strings.HasPrefix(field, "spec.") {
					field = ""
				}
				got[name] = field
			}
			if fmt.Sprint(got) == fmt.Sprint(want) {
				for object, n := range events {
					if n != 1 || counts[object] != 1 {
						t.Errorf("%d LimitExceeded Events on %s (count %d), want 1", n, object, counts[object])
					}
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("LimitExceeded Events %v, want %v", got, want)
			}
			waitTick()
		}
		for kind, n := range map[string]float64{"Peer": 2, "Node": 2} {
			if got := testutil.ToFloat64(agent.Metrics.RejectionsActive.WithLabelValues(string(topology.ReasonLimitExceeded), kind)); got != n {
				t.Errorf("meshlet_rejections_active{LimitExceeded,%s} = %v, want %v", kind, got, n)
			}
		}
		if got := testutil.ToFloat64(agent.Metrics.Rejections.WithLabelValues(string(topology.ReasonLimitExceeded))); got < 4 {
			t.Errorf("meshlet_rejections_total{LimitExceeded} = %v, want at least 4", got)
		}
	})

	dev.mu.Lock()
	lost, applies := dev.lost, dev.n
	dev.mu.Unlock()
	if len(lost) > 0 {
		t.Errorf("ordinary peers left the device: %v", lost[:min(5, len(lost))])
	}
	n, sum := reconcileSeconds(t, agent)
	t.Logf("RESULT hostile: %d remote Nodes, %d Peers (limits %+v): first full plan %v after start; agent heap %.0f MiB after sync, %.0f MiB after the flood; process RSS %.0f / %.0f MiB; %d reconciles, mean %.0f ms; %d applies, none without laptop, b-1, a-2",
		size.remoteNodes, size.floodPeers+2, size.limits, synced.Round(time.Millisecond), heapSynced, liveHeapMiB()-heapBefore,
		rssSynced, processRSSMiB(), n, sum/float64(max(n, 1))*1000, applies)
}
