package leadership

// The elector against a real kube-apiserver with the shipped RBAC: three
// candidates of one location take, renew, lose and release the Lease in
// the order the plan gives, never two at once (the leader marks are
// cluster.Publisher's: TestPublisherLeaderMarks). Outcomes only: no timing
// is asserted.

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/meshlet/meshlet/agent/core/failover"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/apiserver"
)

func repoFile(name string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", name)
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func poll(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not a synchronisation
	}
}

// startAPI starts a kube-apiserver with meshlet's namespace and RBAC.
func startAPI(t *testing.T) (context.Context, *apiserver.Server, kubernetes.Interface) {
	t.Helper()
	srv := apiserver.Start(t, apiserver.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for _, f := range []string{"manifests/namespace/namespace.yaml", "manifests/base/rbac.yaml"} {
		if _, err := apiserver.ApplyFile(ctx, srv.AdminConfig(), repoFile(f), apiserver.ApplyOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return ctx, srv, kubernetes.NewForConfigOrDie(srv.AdminConfig())
}

func TestElectorTakesRenewsReleasesInOrder(t *testing.T) {
	if testing.Short() {
		t.Skip("needs kube-apiserver")
	}
	ctx, srv, admin := startAPI(t)
	for _, n := range []string{"x-1", "x-2", "x-3"} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The agents' own credentials: the shipped RBAC must allow all of it.
	// Each candidate's Lease writes can be made to go unanswered (failWrites).
	saConfig := srv.ServiceAccountConfig(ctx, "kilo-system", "meshlet")
	var failWrites sync.Map // node → bool
	var blocked atomic.Int64
	agentFor := func(n string) kubernetes.Interface {
		cfg := rest.CopyConfig(saConfig)
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			return roundTripper(func(r *http.Request) (*http.Response, error) {
				if v, _ := failWrites.Load(n); v == true && r.Method != http.MethodGet && strings.Contains(r.URL.Path, "/leases") {
					blocked.Add(1)
					return nil, errors.New("injected: the API server did not answer")
				}
				return rt.RoundTrip(r)
			})
		}
		return kubernetes.NewForConfigOrDie(cfg)
	}
	const lease = "meshlet-leader-x"
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	type cand struct {
		e      *Elector
		cancel context.CancelFunc
	}
	cands := map[string]*cand{}
	var mu sync.Mutex
	dead := map[string]bool{}
	for _, n := range []string{"x-1", "x-2", "x-3"} {
		cctx, ccancel := context.WithCancel(ctx)
		e := &Elector{Client: agentFor(n), Namespace: "kilo-system", Identity: n, Log: log.With("node", n)}
		e.Start(cctx)
		cands[n] = &cand{e, ccancel}
	}
	// Two holders at once, by the electors' own belief, fail the test.
	go func() {
		for ctx.Err() == nil {
			held := []string{}
			mu.Lock()
			for n, c := range cands {
				if !dead[n] && c.e.Status().Held {
					held = append(held, n)
				}
			}
			mu.Unlock()
			if len(held) > 1 {
				t.Errorf("two holders at once: %v", held)
				return
			}
			time.Sleep(5 * time.Millisecond) // sampling interval
		}
	}()
	follow := func(n string, l topology.Leadership) {
		t.Helper()
		l.Location, l.Lease, l.Governed = "x", lease, true
		if err := cands[n].e.Follow(ctx, topology.Plan{Leadership: &l}, true, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	get := func() (holder string, annotations map[string]string) {
		l, err := admin.CoordinationV1().Leases("kilo-system").Get(ctx, lease, metav1.GetOptions{})
		if err != nil {
			return "", nil
		}
		if l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		return holder, l.Annotations
	}

	// 1. No Lease yet: x-1 (rank 0) takes it; x-2 and x-3 wait their rank.
	follow("x-2", topology.Leadership{Candidate: true, Wait: failover.RankStagger})
	follow("x-3", topology.Leadership{Candidate: true, Wait: 2 * failover.RankStagger})
	follow("x-1", topology.Leadership{Candidate: true})
	poll(t, ctx, "x-1 holding", func() bool { h, _ := get(); return h == "x-1" })
	// It keeps it while it renews: the others see renewals and never take it.
	follow("x-1", topology.Leadership{Candidate: true, Hold: true})
	ren := cands["x-1"].e.Status().RenewedAt
	poll(t, ctx, "three renewals", func() bool { return cands["x-1"].e.Status().RenewedAt.After(ren.Add(2 * time.Second)) })
	if h, _ := get(); h != "x-1" {
		t.Fatalf("holder %q after renewals, want x-1", h)
	}

	// 2. x-1 dies (no release): once it stopped renewing, x-2 — first now —
	// takes it.
	mu.Lock()
	dead["x-1"] = true
	mu.Unlock()
	cands["x-1"].cancel()
	follow("x-2", topology.Leadership{Candidate: true})
	poll(t, ctx, "x-2 holding", func() bool { h, _ := get(); return h == "x-2" })
	follow("x-2", topology.Leadership{Candidate: true, Hold: true})

	// 3. x-2 steps aside: it releases at once, recording why; x-3 takes it.
	follow("x-2", topology.Leadership{StepAside: failover.ReasonWireGuardDegraded, Release: failover.ReasonWireGuardDegraded})
	follow("x-3", topology.Leadership{Candidate: true})
	poll(t, ctx, "x-3 holding", func() bool { h, _ := get(); return h == "x-3" })
	_, ann := get()
	var sa map[string]topology.StepAside
	if err := json.Unmarshal([]byte(ann[AnnotationStepAsides]), &sa); err != nil || sa["x-2"].Reason != failover.ReasonWireGuardDegraded {
		t.Errorf("step-asides %q (%v): want x-2's", ann[AnnotationStepAsides], err)
	}
	if st := cands["x-3"].e.State(); st.Holder != "x-3" || st.StepAsides["x-2"].Reason != failover.ReasonWireGuardDegraded {
		t.Errorf("x-3's view %+v", st)
	}

	follow("x-3", topology.Leadership{Candidate: true, Hold: true})
	// 4. x-3 dies while x-2's writes go unanswered (an API server
	// restarting): x-2 finds x-3 expired, fails to take the Lease, reads
	// it again once the API answers and then takes it.
	failWrites.Store("x-2", true)
	mu.Lock()
	dead["x-3"] = true
	mu.Unlock()
	cands["x-3"].cancel()
	follow("x-2", topology.Leadership{Candidate: true})
	poll(t, ctx, "x-2 trying to take the Lease", func() bool { return blocked.Load() > 0 })
	if h, _ := get(); h != "x-3" {
		t.Errorf("holder %q while x-2's writes fail, want x-3 still", h)
	}
	failWrites.Store("x-2", false)
	poll(t, ctx, "x-2 holding after the API answers again", func() bool { h, _ := get(); return h == "x-2" })

	// 5. x-2's agent stops for a restart (docs/failover.md#restart): its
	// last renewal stretches the Lease to the grace, which a candidate
	// that starts meanwhile reads as the holder's duration; the node's
	// next agent (the same identity) resumes the Lease with the usual one.
	follow("x-2", topology.Leadership{Candidate: true, Hold: true})
	if ok, err := cands["x-2"].e.Suspend(ctx, 10*time.Second); !ok || err != nil {
		t.Fatalf("Suspend = %v, %v; want the held Lease stretched", ok, err)
	}
	l, err := admin.CoordinationV1().Leases("kilo-system").Get(ctx, lease, metav1.GetOptions{})
	if err != nil || *l.Spec.HolderIdentity != "x-2" || *l.Spec.LeaseDurationSeconds != 10 || l.Annotations[AnnotationRestarting] == "" {
		t.Fatalf("Lease after Suspend: %+v, %v; want x-2's, 10 s, a restart note", l, err)
	}
	mu.Lock()
	dead["x-2"] = true
	mu.Unlock()
	cands["x-2"].cancel()
	c1 := &Elector{Client: agentFor("x-1"), Namespace: "kilo-system", Identity: "x-1", Log: log.With("node", "x-1")}
	c1.Start(ctx)
	c1.Watch(lease)
	poll(t, ctx, "a new candidate's view", func() bool { return c1.Synced() && c1.State().Holder == "x-2" })
	if st := c1.State(); st.Duration != 10*time.Second {
		t.Errorf("a candidate presumes the restarting holder alive for %v, want the 10 s grace", st.Duration)
	}
	back := &Elector{Client: agentFor("x-2"), Namespace: "kilo-system", Identity: "x-2", Log: log.With("node", "x-2")}
	back.Start(ctx)
	back.Watch(lease)
	poll(t, ctx, "x-2's next agent renewing with the usual duration", func() bool {
		l, err := admin.CoordinationV1().Leases("kilo-system").Get(ctx, lease, metav1.GetOptions{})
		return err == nil && *l.Spec.HolderIdentity == "x-2" && *l.Spec.LeaseDurationSeconds == int32(DefaultDuration/time.Second) &&
			l.Annotations[AnnotationRestarting] == ""
	})
	if !back.Held() {
		t.Error("x-2's next agent does not hold the Lease it resumed")
	}

	// Role history: a leader from when its run started, then not.
	e := &Elector{}
	t0 := time.Now()
	e.recordRole(true, true, t0)
	e.recordRole(true, true, t0.Add(time.Second))
	e.recordRole(false, false, t0.Add(2*time.Second))
	e.recordRole(false, true, t0.Add(3*time.Second))
	if r := e.Roles(); len(r) != 2 || !r[0].Leader || !r[0].At.Equal(t0) || r[1].Leader {
		t.Errorf("roles %+v: want leader from the run's start, then not once applied", r)
	}
}

// TestElectorWakesThePlanOnChangesOnly: a renewal of the Lease wakes no
// plan (it changes nothing the planner decides on until it runs out); the
// holder going silent wakes it once, when the Lease runs out in this
// node's view, and its next renewal once more; a new holder wakes it.
func TestElectorWakesThePlanOnChangesOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("needs kube-apiserver")
	}
	ctx, srv, admin := startAPI(t)
	const lease = "meshlet-leader-x"
	holder, secs := "x-9", int32(2)
	now := metav1.NewMicroTime(time.Now())
	l, err := admin.CoordinationV1().Leases("kilo-system").Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: lease, Namespace: "kilo-system"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var wakes atomic.Int32
	e := &Elector{Client: kubernetes.NewForConfigOrDie(srv.ServiceAccountConfig(ctx, "kilo-system", "meshlet")), Namespace: "kilo-system",
		Identity: "x-1", Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Notify: func(time.Time) { wakes.Add(1) }}
	e.Start(ctx)
	// Not a candidate: it never takes the Lease, so every wake is a view's.
	if err := e.Follow(ctx, topology.Plan{Leadership: &topology.Leadership{Location: "x", Lease: lease, Governed: true}}, true, time.Now()); err != nil {
		t.Fatal(err)
	}
	// Two wakes to begin with: the Lease first seen, the watch synced.
	poll(t, ctx, "the Lease seen", func() bool { return e.Synced() && e.State().Holder == holder && wakes.Load() >= 2 })
	renew := func() {
		t.Helper()
		at := metav1.NewMicroTime(time.Now())
		l.Spec.RenewTime = &at
		var err error
		if l, err = admin.CoordinationV1().Leases("kilo-system").Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Each renewal is seen (its freshness moves) before the next; the
	// handler that saw the holder first has returned by then.
	seenRenewal := func() {
		t.Helper()
		before := e.State().Fresh
		renew()
		poll(t, ctx, "a renewal seen", func() bool { return e.State().Fresh.After(before) })
	}
	seenRenewal()
	base := wakes.Load()
	for range 3 {
		seenRenewal()
	}
	if got := wakes.Load() - base; got != 0 {
		t.Errorf("three renewals woke the plan %d times, want 0", got)
	}
	// Silent: one wake once its 2 s have run out.
	poll(t, ctx, "the plan woken for the silent holder", func() bool { return wakes.Load() > base })
	if got := wakes.Load() - base; got != 1 {
		t.Errorf("the silent holder woke the plan %d times, want 1", got)
	}
	seenRenewal()
	if got := wakes.Load() - base; got != 2 {
		t.Errorf("after the silent holder renewed: %d wakes, want 2 (one more)", got)
	}
	other := "x-8"
	l.Spec.HolderIdentity = &other
	renew()
	poll(t, ctx, "the new holder seen", func() bool { return e.State().Holder == other })
	poll(t, ctx, "the plan woken for the new holder", func() bool { return wakes.Load()-base == 3 })
}

// A Lease free for long: nodes that become candidates for it at one moment
// (their location just became governed, its last kg node having switched)
// wait their rank from that moment, so the first in Kilo's order takes it
// and not whichever plans first. The clock is fake: the second candidate's
// stagger never runs out here, so it cannot take the Lease unless it
// counted from the Lease's freeing.
func TestElectorNewCandidatesWaitTheirRank(t *testing.T) {
	if testing.Short() {
		t.Skip("needs kube-apiserver")
	}
	ctx, srv, admin := startAPI(t)
	const lease = "meshlet-leader-s"
	clk := clocktesting.NewFakeClock(time.Now())
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// The plan is woken once the watch has listed the Lease absent (and
	// taken the time it found it free).
	var listed atomic.Int32
	elector := func(n string) *Elector {
		e := &Elector{Client: kubernetes.NewForConfigOrDie(srv.ServiceAccountConfig(ctx, "kilo-system", "meshlet")),
			Namespace: "kilo-system", Identity: n, Log: log.With("node", n), Clock: clk,
			Notify: func(time.Time) { listed.Add(1) }}
		e.Start(ctx)
		return e
	}
	s1, s2 := elector("s-1"), elector("s-2")
	follow := func(e *Elector, l topology.Leadership) {
		t.Helper()
		l.Location, l.Lease = "s", lease
		if err := e.Follow(ctx, topology.Plan{Leadership: &l}, true, clk.Now()); err != nil {
			t.Fatal(err)
		}
	}
	// Kilo's rule while kg runs in the location: no candidate, no Lease.
	follow(s1, topology.Leadership{})
	follow(s2, topology.Leadership{})
	poll(t, ctx, "both watching the absent Lease", func() bool { return listed.Load() == 2 })
	clk.Step(time.Minute)
	// Governed: s-2 (rank 1) happens to plan first. It waits its stagger
	// from now, not from when the Lease was found free.
	follow(s2, topology.Leadership{Governed: true, Candidate: true, Wait: failover.RankStagger})
	poll(t, ctx, "s-2 decided", func() bool { st := s2.Status(); return st.Held || !st.TakesAt.IsZero() })
	if st, want := s2.Status(), clk.Now().Add(failover.RankStagger); st.Held || !st.TakesAt.Equal(want) {
		t.Fatalf("s-2 holds %v, takes the Lease at %v: want it waiting until %v", st.Held, st.TakesAt, want)
	}
	follow(s1, topology.Leadership{Governed: true, Candidate: true})
	poll(t, ctx, "s-1 holding", func() bool { return s1.Status().Held })
	l, err := admin.CoordinationV1().Leases("kilo-system").Get(ctx, lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := l.Spec.HolderIdentity; h == nil || *h != "s-1" || s2.Status().Held {
		t.Errorf("holder %v (s-2 holds: %v), want s-1 alone", h, s2.Status().Held)
	}
}
