package e2e

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/meshlet/meshlet/agent/core/failover"
	"github.com/meshlet/meshlet/agent/runtime/leadership"
	"github.com/meshlet/meshlet/e2e/harness"
)

// holderWatch samples a location's Lease every 100 ms and counts the
// changes of its holder (an observation: nothing waits on it).
type holderWatch struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu          sync.Mutex
	holder      string
	changes     []string // "a → b at hh:mm:ss.mmm"
	changedAt   map[string]time.Time
	transitions int32 // spec.leaseTransitions as last read
	errs        int
}

func watchHolder(ctx context.Context, c *harness.Cluster, lease string) *holderWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &holderWatch{cancel: cancel, done: make(chan struct{}), changedAt: map[string]time.Time{}}
	go func() {
		defer close(w.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		first := true
		for {
			l, err := c.Admin.CoordinationV1().Leases(harness.Namespace).Get(ctx, lease, metav1.GetOptions{})
			w.mu.Lock()
			switch {
			case err != nil:
				w.errs++
			default:
				h := ""
				if l.Spec.HolderIdentity != nil {
					h = *l.Spec.HolderIdentity
				}
				if l.Spec.LeaseTransitions != nil {
					w.transitions = *l.Spec.LeaseTransitions
				}
				if !first && h != w.holder {
					now := time.Now()
					w.changes = append(w.changes, fmt.Sprintf("%q → %q at %s", w.holder, h, now.Format("15:04:05.000")))
					w.changedAt[h] = now
				}
				w.holder, first = h, false
			}
			w.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return w
}

func (w *holderWatch) stop() {
	w.cancel()
	<-w.done
}

// changeList is the holder changes seen so far.
func (w *holderWatch) changeList() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.changes...)
}

// took is when holder took the Lease, as sampled (zero: not seen).
func (w *holderWatch) took(holder string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changedAt[holder]
}

// ledLocation builds cluster-a's location x of a-x1 and a-x2, led by
// a-x1 with meshlet's mark, and cluster-b's b-z1.
func ledLocation(t *testing.T, tune ...func(*harness.Options)) (context.Context, *harness.Cluster, *harness.Node, *harness.Node, *harness.Node) {
	t.Helper()
	env, ctx := newEnv(t, tune...)
	must(t, env.Build(ctx, harness.Small(2, "z")))
	x1, x2, z1 := env.Node("a-x1"), env.Node("a-x2"), env.Node("b-z1")
	if l := leaderOf(t, ctx, x1, x2); l != x1 {
		t.Fatalf("leader %s, want a-x1", l.Name)
	}
	awaitMark(t, ctx, x1, x2)
	return ctx, env.Cluster("cluster-a"), x1, x2, z1
}

// Scenario 13 (docs/failover.md#restart): the leader's agent restarts
// gracefully — SIGTERM, down for twice the Lease's duration as a
// DaemonSet's rolling update or a deleted pod leaves it, started again —
// three times, while a non-leader's pod pings a remote pod through it and
// the remote pod pings the leader's, each at 10/s. The agent, stopping
// on a node that is not going away, stretches its Lease to
// --leader-restart-grace (30 s) and its next process resumes it: the
// Lease's holder never changes, nobody else takes the location's role,
// and the device, left in place, forwards throughout.
func TestLeaderRestartKeepsRole(t *testing.T) {
	ctx, a, x1, x2, z1 := ledLocation(t)
	_, err := x2.WaitReachable(ctx, z1.PodIP, 30*time.Second)
	must(t, err)
	_, err = z1.WaitReachable(ctx, x1.PodIP, 30*time.Second)
	must(t, err)
	lease := failover.LeaseName("x")
	before, err := a.Admin.CoordinationV1().Leases(harness.Namespace).Get(ctx, lease, metav1.GetOptions{})
	must(t, err)
	mon := harness.WatchLeadership(ctx, x1, x2)
	hw := watchHolder(ctx, a, lease)
	through, direct := startPinging(t, ctx, x2, z1), startPinging(t, ctx, z1, x1)

	const restarts, down = 3, 6 * time.Second // twice the 3 s Lease
	var stopTook, backTook []time.Duration
	stretched := 0
	for range restarts {
		at := time.Now()
		must(t, x1.Stop(syscall.SIGTERM))
		stopTook = append(stopTook, time.Since(at))
		// What the others see while the agent is away: the Lease stretched.
		l, err := a.Admin.CoordinationV1().Leases(harness.Namespace).Get(ctx, lease, metav1.GetOptions{})
		must(t, err)
		if l.Annotations[leadership.AnnotationRestarting] != "" && l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds == 30 {
			stretched++
		}
		// The pod's absence during a rolling update, not a synchronisation.
		pace(ctx, down-time.Since(at))
		back := time.Now()
		must(t, x1.Start(ctx))
		backTook = append(backTook, time.Since(back))
		// Resumed: the usual duration again, the restart note gone.
		must(t, harness.Poll(ctx, 10*time.Second, 100*time.Millisecond, "a-x1 renewing with the usual duration", func() (bool, error) {
			l, err := a.Admin.CoordinationV1().Leases(harness.Namespace).Get(ctx, lease, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			d := l.Spec.LeaseDurationSeconds
			return d != nil && *d == 3 && l.Annotations[leadership.AnnotationRestarting] == "" && *l.Spec.HolderIdentity == "a-x1",
				fmt.Errorf("holder %v, duration %v, restarting %q", *l.Spec.HolderIdentity, *d, l.Annotations[leadership.AnnotationRestarting])
		}))
		// Traffic between restarts, as between two nodes of a rollout.
		pace(ctx, 3*time.Second)
	}
	tl, tld := through.Stop(), direct.Stop()
	hw.stop()
	mon.Stop()
	lead := mon.Result()
	after, err := a.Admin.CoordinationV1().Leases(harness.Namespace).Get(ctx, lease, metav1.GetOptions{})
	must(t, err)
	m, err := x2.Metrics(ctx)
	must(t, err)
	took, _ := m.Value("meshlet_leader_changes_total")
	led := false
	for _, s := range mon.Samples() {
		for _, n := range s.Leaders {
			led = led || n == x2.Name
		}
	}
	transitions := *after.Spec.LeaseTransitions - *before.Spec.LeaseTransitions
	report(t, "leader a-x1's agent restarted gracefully %d times (SIGTERM, %v away, exit in median %v, ready again in median %v): the Lease stretched to 30 s while away %d/%d times; %d holder changes in the Lease (%d samples failed), %d transitions, %d leader changes by a-x2, a-x2's kilo0 configured in %d of %d samples: %v; pings at 10/s a-x2→b-z1 (through the leader) %d/%d lost (longest gap %v), b-z1→a-x1 %d/%d lost (longest gap %v) (goal: 0 role changes, 0 lost); %s",
		restarts, down, percentile(stopTook, 0.5).Round(10*time.Millisecond), percentile(backTook, 0.5).Round(10*time.Millisecond), stretched, restarts,
		len(hw.changes), hw.errs, transitions, int(took), boolCount(led), lead.Samples, led,
		tl.Lost, tl.Sent, tl.LongestGap().Round(10*time.Millisecond), tld.Lost, tld.Sent, tld.LongestGap().Round(10*time.Millisecond), lead)
	if len(hw.changes) > 0 || transitions != 0 || took != 0 || led {
		t.Errorf("the role changed across graceful restarts: holder changes %v, %d transitions, a-x2 took it %v times, a-x2 configured as leader: %v", hw.changes, transitions, took, led)
	}
	if stretched != restarts {
		t.Errorf("the Lease was stretched for %d of %d restarts", stretched, restarts)
	}
	must(t, lead.Check())
}

func boolCount(b bool) int {
	if b {
		return 1
	}
	return 0
}

// setReady sets a Node's Ready condition as a kubelet would.
func setReady(t *testing.T, ctx context.Context, c *harness.Cluster, node string, ready corev1.ConditionStatus, reason string) {
	t.Helper()
	n, err := c.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	must(t, err)
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			n.Status.Conditions[i].Status, n.Status.Conditions[i].Reason = ready, reason
		}
	}
	_, err = c.Admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
	must(t, err)
}

// cordon sets a Node's spec.unschedulable as kubectl cordon (the first
// step of a drain) and uncordon do.
func cordon(t *testing.T, ctx context.Context, c *harness.Cluster, node string, on bool) {
	t.Helper()
	_, err := c.Admin.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, fmt.Appendf(nil, `{"spec":{"unschedulable":%v}}`, on), metav1.PatchOptions{})
	must(t, err)
}

// Scenario 14 (docs/failover.md#restart): a leader going away hands its
// Lease over at once. First its Node is cordoned (a drain's first step)
// while its agent runs: it steps aside (reason Leaving, no cool-down, not
// degraded), its device role down before it releases, and the next node
// takes the free Lease at once. Then the new leader's Node turns NotReady
// (its kubelet shutting the node down) and its agent gets SIGTERM: it
// hands the Lease over before it exits instead of keeping it for a
// restart. Time to the new holder and the ping gaps are reported; the
// uncordoned first node is a candidate again.
func TestGoingAwayLeaderHandsOver(t *testing.T) {
	ctx, a, x1, x2, z1 := ledLocation(t)
	for _, p := range [][2]*harness.Node{{z1, x1}, {z1, x2}} {
		_, err := p[0].WaitReachable(ctx, p[1].PodIP, 30*time.Second)
		must(t, err)
	}
	lease := failover.LeaseName("x")
	mon := harness.WatchLeadership(ctx, x1, x2)
	hw := watchHolder(ctx, a, lease)
	// b-z1 → a-x2's pod: through a-x1 while it leads, then to a-x2 itself.
	ping := startPinging(t, ctx, z1, x2)

	cordoned := time.Now()
	cordon(t, ctx, a, x1.Name, true)
	must(t, harness.Poll(ctx, 30*time.Second, 50*time.Millisecond, "a-x2 holding the Lease", func() (bool, error) {
		return !hw.took(x2.Name).IsZero(), nil
	}))
	cordonTook := hw.took(x2.Name).Sub(cordoned)
	awaitMark(t, ctx, x2, x1)
	checkFollows(t, ctx, z1, x2, x1)
	after := hw.took(x2.Name)
	must(t, harness.Poll(ctx, 30*time.Second, 50*time.Millisecond, "b-z1 reaching a-x2 through its new leader", func() (bool, error) {
		return ping.Replied(after), nil
	}))
	m1, err := x1.Metrics(ctx)
	must(t, err)
	m2, err := x2.Metrics(ctx)
	must(t, err)
	if v, _ := m1.Value("meshlet_leader_step_asides_total", "reason", failover.ReasonLeaving); v != 1 {
		t.Errorf("a-x1 meshlet_leader_step_asides_total{reason=Leaving} = %v, want 1", v)
	}
	if v, _ := m2.Value("meshlet_leader_changes_total", "reason", leadership.ChangeReleased); v != 1 {
		t.Errorf("a-x2 meshlet_leader_changes_total{reason=Released} = %v, want 1", v)
	}
	if ann, err := a.Annotations(ctx, x1.Name); err != nil || ann["meshlet.io/degraded"] != "" {
		t.Errorf("a-x1 published meshlet.io/degraded %q (%v): a cordoned node is not degraded", ann["meshlet.io/degraded"], err)
	}

	// The first node back as a candidate; the second goes away on SIGTERM.
	cordon(t, ctx, a, x1.Name, false)
	setReady(t, ctx, a, x2.Name, corev1.ConditionFalse, "KubeletNotReady")
	stopped := time.Now()
	must(t, x2.Stop(syscall.SIGTERM))
	stopTook := time.Since(stopped)
	// An agent that has exited leads no more; the monitor polls role
	// histories every 200 ms, so the step-aside it recorded just before it
	// exited (110 ms after the SIGTERM in a run) can fall between two polls
	// and leave its interval open. kilo0's samples still judge the data plane.
	mon.PoweredOff(x2, stopped.Add(stopTook))
	must(t, harness.Poll(ctx, 30*time.Second, 50*time.Millisecond, "a-x1 holding the Lease again", func() (bool, error) {
		return hw.took(x1.Name).After(stopped), nil
	}))
	sigtermTook := hw.took(x1.Name).Sub(stopped)
	awaitMark(t, ctx, x1, x2)
	checkFollows(t, ctx, z1, x1, x2)
	tl := ping.Stop()
	hw.stop()
	mon.Stop()
	res := mon.Result()
	l, err := a.Admin.CoordinationV1().Leases(harness.Namespace).Get(ctx, lease, metav1.GetOptions{})
	must(t, err)
	report(t, "leader a-x1 cordoned: a-x2 held the Lease %v later (goal: at once; the Lease's expiry alone: 3 s, Kilo's rule: never); leader a-x2 NotReady and SIGTERMed: its agent handed over and exited in %v, a-x1 held the Lease %v after the SIGTERM (a restart keeps it up to 30 s); Lease holder changes %v, released by %q; b-z1→a-x2 pings at 10/s: %d/%d lost over both hand-overs, longest gap %v; %s",
		cordonTook.Round(10*time.Millisecond), stopTook.Round(10*time.Millisecond), sigtermTook.Round(10*time.Millisecond), hw.changes,
		l.Annotations[leadership.AnnotationReleased], tl.Lost, tl.Sent, tl.LongestGap().Round(10*time.Millisecond), res)
	if sigtermTook > 10*time.Second {
		t.Errorf("a-x1 took the Lease %v after a-x2, going away, was stopped: it should be handed over, not kept for a restart", sigtermTook)
	}
	must(t, res.Check())
}
