package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"net/netip"
	"os"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/harness"
)

// soakSlots bounds the objects a soak keeps alive of each kind.
const soakSlots = 6

// soakExpect is what one agent's device must show once a change arrived.
type soakExpect struct {
	node *harness.Node
	key  string
	want func(p harness.WGPeer, ok bool) bool
}

// soakSample is one agent's resources at one time.
type soakSample struct {
	at                   time.Time
	rss, goroutines, fds float64
}

// Scenario 14: a soak of MESHLET_SOAK (e.g. 1h; skipped when unset).
// Random changes, one every 0.5-3 s — local nodes of new locations added and
// deleted, remote nodes added, deleted and given a new endpoint, local Peers
// added, updated and deleted — each awaited on the devices it must reach.
// Every MESHLET_SOAK_CHAOS (default 4m) one disruption, in turn: the leader
// of x (a-x1) killed (SIGKILL) and started again, a-x1 restarted gracefully
// (SIGTERM), cluster-a's API server restarted, cluster-b's (each down 5 s,
// longer than the Lease). Every agent's RSS, goroutines and open files are
// sampled every 30 s and their slopes reported after a warm-up (a-x1's since
// its last start); a leak (growth well past noise) fails the test, as do a
// change that never converged, an Event storm, a split leadership of
// location x and a-x2 taking the Lease from a restarting a-x1.
func TestSoak(t *testing.T) {
	d := os.Getenv("MESHLET_SOAK")
	if d == "" {
		t.Skip("MESHLET_SOAK unset (e.g. MESHLET_SOAK=30m)")
	}
	dur, err := time.ParseDuration(d)
	must(t, err)
	chaosEvery := 4 * time.Minute
	if c := os.Getenv("MESHLET_SOAK_CHAOS"); c != "" {
		chaosEvery, err = time.ParseDuration(c)
		must(t, err)
	}
	env, ctx := newEnv(t)
	must(t, env.Build(ctx, harness.Small(2, "z", "w")))
	a, b := env.Cluster("cluster-a"), env.Cluster("cluster-b")
	x1, x2, z1, w1 := env.Node("a-x1"), env.Node("a-x2"), env.Node("b-z1"), env.Node("b-w1")
	agents := []*harness.Node{x1, x2, z1, w1}
	if l := leaderOf(t, ctx, x1, x2); l != x1 {
		t.Fatalf("leader %s, want a-x1", l.Name)
	}
	_, err = x2.WaitReachable(ctx, z1.PodIP, 30*time.Second)
	must(t, err)
	eventsBefore := soakEvents(t, ctx, a, b)
	mon := harness.WatchLeadership(ctx, x1, x2)

	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("soak for %v, seed %d", dur, seed)
	// Slots: a live object per slot of each kind, its key.
	local, remote, peers := map[int]string{}, map[int]string{}, map[int]string{}
	peerIP := map[int]string{}
	free := func(m map[int]string) (int, bool) {
		for i := 0; i < soakSlots; i++ {
			if _, ok := m[i]; !ok {
				return i, true
			}
		}
		return 0, false
	}
	pick := func(m map[int]string) (int, bool) {
		if len(m) == 0 {
			return 0, false
		}
		ks := make([]int, 0, len(m))
		for k := range m {
			ks = append(ks, k)
		}
		sort.Ints(ks)
		return ks[rng.Intn(len(ks))], true
	}
	has := func(pod string) func(harness.WGPeer, bool) bool {
		return func(p harness.WGPeer, ok bool) bool { return ok && contains(p.AllowedIPs, pod) }
	}
	gone := func(p harness.WGPeer, ok bool) bool { return !ok }

	// addNode adds a node of a new location in a free slot of live: pod
	// CIDR 10.<net>.(200+slot).0/24, endpoint 172.20.0.(ep+slot), WireGuard
	// IP 100.66.<wg>.(100+slot); seen by the devices of on.
	addNode := func(live map[int]string, c *harness.Cluster, prefix, loc string, net, ep, wg int, on ...*harness.Node) (string, []soakExpect, error) {
		i, ok := free(live)
		if !ok {
			return "", nil, nil
		}
		pod := fmt.Sprintf("10.%d.%d.0/24", net, 200+i)
		f, err := c.AddFakeNode(ctx, harness.FakeNode{Name: fmt.Sprintf("%s%d", prefix, i), Location: fmt.Sprintf("%s%d", loc, i),
			PodCIDR: netip.MustParsePrefix(pod), Endpoint: fmt.Sprintf("172.20.0.%d:51820", ep+i), WireGuardIP: fmt.Sprintf("100.66.%d.%d/24", wg, 100+i)})
		live[i] = f.PublicKey
		var exp []soakExpect
		for _, n := range on {
			exp = append(exp, soakExpect{n, f.PublicKey, has(pod)})
		}
		return "add node " + f.Name, exp, err
	}
	// deleteNode deletes a node addNode added, gone from the devices of on.
	deleteNode := func(live map[int]string, c *harness.Cluster, prefix string, on ...*harness.Node) (string, []soakExpect, error) {
		i, ok := pick(live)
		if !ok {
			return "", nil, nil
		}
		key, name := live[i], fmt.Sprintf("%s%d", prefix, i)
		delete(live, i)
		c.StopRefreshing(name)
		var exp []soakExpect
		for _, n := range on {
			exp = append(exp, soakExpect{n, key, gone})
		}
		return "delete node " + name, exp, c.DeleteNode(ctx, name)
	}

	// change makes one random change and returns what it did and what the
	// devices must show; "" when the chosen kind had nothing to do.
	change := func() (string, []soakExpect, error) {
		switch rng.Intn(8) {
		case 0: // a local node of a new location (sorts after x: x keeps its WireGuard IP)
			return addNode(local, a, "a-y", "y", 1, 200, 0, x1, z1)
		case 1:
			return deleteNode(local, a, "a-y", x1, z1)
		case 2: // a remote node of a new location (sorts after z)
			return addNode(remote, b, "b-zz", "zz", 2, 220, 1, x1)
		case 3:
			return deleteNode(remote, b, "b-zz", x1)
		case 4:
			i, ok := pick(remote)
			if !ok {
				return "", nil, nil
			}
			ep := fmt.Sprintf("172.20.0.%d:%d", 220+i, 40000+rng.Intn(20000))
			return fmt.Sprintf("endpoint of b-zz%d", i), []soakExpect{{x1, remote[i], func(p harness.WGPeer, ok bool) bool { return ok && p.Endpoint == ep }}},
				b.PatchNodeAnnotations(ctx, fmt.Sprintf("b-zz%d", i), map[string]*string{topology.AnnotationClusterMeshEndpoint: &ep})
		case 5:
			i, ok := free(peers)
			if !ok {
				return "", nil, nil
			}
			ip := fmt.Sprintf("10.1.250.%d/32", 1+i)
			key, err := a.ApplyPeer(ctx, fmt.Sprintf("p%d", i), ip, "")
			peers[i], peerIP[i] = key, ip
			return fmt.Sprintf("add Peer p%d", i), []soakExpect{{x1, key, has(ip)}}, err
		case 6:
			i, ok := pick(peers)
			if !ok {
				return "", nil, nil
			}
			ip := fmt.Sprintf("10.1.%d.%d/32", 250+rng.Intn(5), 1+i)
			if ip == peerIP[i] {
				return "", nil, nil
			}
			_, err := a.ApplyPeer(ctx, fmt.Sprintf("p%d", i), ip, peers[i])
			peerIP[i] = ip
			return fmt.Sprintf("update Peer p%d", i), []soakExpect{{x1, peers[i], has(ip)}}, err
		default:
			i, ok := pick(peers)
			if !ok {
				return "", nil, nil
			}
			key := peers[i]
			delete(peers, i)
			delete(peerIP, i)
			return fmt.Sprintf("delete Peer p%d", i), []soakExpect{{x1, key, gone}}, a.DeletePeer(ctx, fmt.Sprintf("p%d", i))
		}
	}

	// disrupt makes the next disruption in turn and says what it was.
	var chaos []string
	agentStart := map[string]time.Time{}
	disrupt := func() string {
		at := time.Now()
		var what string
		switch len(chaos) % 4 {
		case 0, 1:
			sig, how := syscall.SIGKILL, "killed (SIGKILL)"
			if len(chaos)%4 == 1 {
				sig, how = syscall.SIGTERM, "restarted (SIGTERM)"
			}
			must(t, x1.Stop(sig))
			must(t, x1.Start(ctx))
			agentStart[x1.Name] = time.Now()
			what = fmt.Sprintf("a-x1 %s, ready again after %v", how, time.Since(at).Round(10*time.Millisecond))
		default:
			c := a
			if len(chaos)%4 == 3 {
				c = b
			}
			c.Server.Stop()
			pace(ctx, 5*time.Second)
			c.Server.Start()
			what = fmt.Sprintf("%s's API server restarted (down %v)", c.Name, time.Since(at).Round(100*time.Millisecond))
		}
		chaos = append(chaos, what)
		t.Logf("chaos %d at %s: %s", len(chaos), at.Format("15:04:05"), what)
		return what
	}

	samples := map[string][]soakSample{}
	sample := func() {
		for _, n := range agents {
			m, err := n.Metrics(ctx)
			if err != nil {
				t.Errorf("%s metrics: %v", n.Name, err)
				continue
			}
			rss, _ := m.Value("process_resident_memory_bytes")
			g, _ := m.Value("go_goroutines")
			fds, _ := m.Value("process_open_fds")
			samples[n.Name] = append(samples[n.Name], soakSample{time.Now(), rss, g, fds})
		}
	}
	// await waits until the devices show expects.
	await := func(what string, expects []soakExpect) error {
		return harness.Poll(ctx, 30*time.Second, 20*time.Millisecond, what, func() (bool, error) {
			for _, e := range expects {
				d, err := e.node.Device()
				if err != nil || d == nil {
					return false, err
				}
				p, ok := d.Peers[e.key]
				if !e.want(p, ok) {
					return false, fmt.Errorf("%s: not yet", e.node.Name)
				}
			}
			return true, nil
		})
	}
	start := time.Now()
	sample()
	lastSample, lastChaos := start, start
	var lat []time.Duration
	var failed []string
	kinds := map[string]int{}
	for time.Since(start) < dur && ctx.Err() == nil {
		what, expects, err := change()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if what != "" {
			kinds[strings.Fields(what)[0]]++
			began := time.Now()
			if err := await(what, expects); err != nil {
				failed = append(failed, fmt.Sprintf("%s at %s: %v", what, began.Format("15:04:05"), err))
			} else {
				lat = append(lat, time.Since(began))
			}
		}
		if time.Since(lastSample) >= 30*time.Second {
			sample()
			lastSample = time.Now()
		}
		if time.Since(lastChaos) >= chaosEvery && time.Since(start)+chaosEvery/2 < dur {
			disrupt()
			lastChaos = time.Now()
		}
		pace(ctx, 500*time.Millisecond+time.Duration(rng.Int63n(int64(2500*time.Millisecond))))
	}
	sample()
	mon.Stop()
	lres := mon.Result()
	eventsAfter := soakEvents(t, ctx, a, b)
	// The slots' nodes are API objects with no agent behind them: the
	// leaders' handshakes to them go unanswered, which meshlet rightly
	// reports (NoHandshakeReply). They go before the end, so the
	// scenario's end check (endFindings) judges the real nodes alone.
	for _, s := range []struct {
		live   map[int]string
		c      *harness.Cluster
		prefix string
		on     []*harness.Node
	}{{local, a, "a-y", []*harness.Node{x1, z1}}, {remote, b, "b-zz", []*harness.Node{x1}}} {
		for len(s.live) > 0 {
			what, expects, err := deleteNode(s.live, s.c, s.prefix, s.on...)
			must(t, err)
			must(t, await(what, expects))
		}
	}

	// Slopes after a warm-up of a tenth of the soak (caches filled, the
	// slots populated), per hour; for a restarted agent, from the same
	// warm-up after its last start.
	var slopes, leaks []string
	for _, n := range agents {
		began := start
		if at, ok := agentStart[n.Name]; ok {
			began = at
		}
		warm := began.Add(dur / 10)
		var s []soakSample
		for _, x := range samples[n.Name] {
			if !x.at.Before(warm) {
				s = append(s, x)
			}
		}
		if len(s) < 3 {
			continue
		}
		rss := slope(s, func(x soakSample) float64 { return x.rss / (1 << 20) })
		g := slope(s, func(x soakSample) float64 { return x.goroutines })
		f := slope(s, func(x soakSample) float64 { return x.fds })
		first, last := s[0], s[len(s)-1]
		slopes = append(slopes, fmt.Sprintf("%s (%v of samples) RSS %.1f→%.1f MiB (%+.2f MiB/h), goroutines %.0f→%.0f (%+.1f/h), open files %.0f→%.0f (%+.1f/h)",
			n.Name, last.at.Sub(first.at).Round(time.Minute), first.rss/(1<<20), last.rss/(1<<20), rss, first.goroutines, last.goroutines, g, first.fds, last.fds, f))
		// A leak is growth well past what the number of live objects
		// explains: each kind stays under soakSlots.
		if grew(s, func(x soakSample) float64 { return x.goroutines }, 1.25, 20) {
			leaks = append(leaks, n.Name+" goroutines")
		}
		if grew(s, func(x soakSample) float64 { return x.fds }, 1.25, 10) {
			leaks = append(leaks, n.Name+" open files")
		}
		if grew(s, func(x soakSample) float64 { return x.rss }, 1.5, 16<<20) {
			leaks = append(leaks, n.Name+" RSS")
		}
	}
	evs := eventsAfter.sub(eventsBefore)
	m2, err := x2.Metrics(ctx)
	must(t, err)
	took, _ := m2.Value("meshlet_leader_changes_total")
	report(t, "%d disruptions every %v: %s; a-x2 took the Lease %v times", len(chaos), chaosEvery, strings.Join(chaos, "; "), took)
	report(t, "%v of random changes (seed %d): %d changes (%s), %d converged (p50 %v, p99 %v, max %v), %d did not; Events written: %d objects, %d occurrences (%s); %s",
		dur, seed, len(lat)+len(failed), soakKinds(kinds), len(lat), percentile(lat, 0.5).Round(time.Millisecond),
		percentile(lat, 0.99).Round(time.Millisecond), percentile(lat, 1).Round(time.Millisecond), len(failed),
		evs.objects, evs.count, evs.reasons(), lres)
	report(t, "resources after a %v warm-up, %d samples per agent: %s", dur/10, len(samples[x1.Name]), strings.Join(slopes, "; "))
	for _, f := range failed {
		t.Errorf("not converged: %s", f)
	}
	if len(leaks) > 0 {
		t.Errorf("grew: %s", strings.Join(leaks, ", "))
	}
	// No storm: valid changes write no Events; allow one per change.
	if evs.count > len(lat)+len(failed) {
		t.Errorf("%d Events for %d changes: %s", evs.count, len(lat)+len(failed), evs.reasons())
	}
	if took != 0 {
		t.Errorf("a-x2 took the Lease %v times: a restarting holder keeps it, and no one takes a Lease it cannot see", took)
	}
	must(t, lres.Check())
}

// slope is the least-squares slope of f over the samples, per hour.
func slope(s []soakSample, f func(soakSample) float64) float64 {
	var sx, sy, sxx, sxy float64
	n := float64(len(s))
	for _, x := range s {
		h := x.at.Sub(s[0].at).Hours()
		y := f(x)
		sx, sy, sxx, sxy = sx+h, sy+y, sxx+h*h, sxy+h*y
	}
	den := n*sxx - sx*sx
	if den == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / den
}

// grew reports whether the median of the last three samples exceeds the
// median of the first three by more than both factor and abs.
func grew(s []soakSample, f func(soakSample) float64, factor, abs float64) bool {
	med := func(xs []soakSample) float64 {
		v := make([]float64, 0, len(xs))
		for _, x := range xs {
			v = append(v, f(x))
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	first, last := med(s[:3]), med(s[len(s)-3:])
	return last > first*factor && last-first > abs
}

func soakKinds(k map[string]int) string {
	names := make([]string, 0, len(k))
	for n := range k {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []string
	for _, n := range names {
		out = append(out, fmt.Sprintf("%s %d", n, k[n]))
	}
	return strings.Join(out, ", ")
}

// eventTally counts Events in some clusters: objects, occurrences (their
// count) and occurrences by reason.
type eventTally struct {
	objects, count int
	byReason       map[string]int
}

func soakEvents(t *testing.T, ctx context.Context, cs ...*harness.Cluster) eventTally {
	t.Helper()
	e := eventTally{byReason: map[string]int{}}
	for _, c := range cs {
		l, err := c.Admin.CoreV1().Events("").List(ctx, metav1.ListOptions{})
		must(t, err)
		for _, ev := range l.Items {
			n := max(int(ev.Count), 1)
			e.objects++
			e.count += n
			e.byReason[ev.Reason] += n
		}
	}
	return e
}

func (e eventTally) sub(before eventTally) eventTally {
	out := eventTally{objects: e.objects - before.objects, count: e.count - before.count, byReason: map[string]int{}}
	for r, n := range e.byReason {
		if d := n - before.byReason[r]; d != 0 {
			out.byReason[r] = d
		}
	}
	return out
}

func (e eventTally) reasons() string {
	if len(e.byReason) == 0 {
		return "none"
	}
	return soakKinds(e.byReason)
}
