package leadership

import (
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"github.com/meshlet/meshlet/agent/core/failover"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// TestElectorTakesTheLeaseFromAForeignHolder: a Lease held, and renewed
// every 100 ms, by a name that is none of the location's Ready nodes (what
// a node of another location may write: docs/security.md#admission) does
// not keep the location's candidate out: it is treated as a holder that
// stopped renewing, the candidate takes the Lease, and the location's
// leader reports it with a ForeignLeaseHolder Event on the Lease. Without
// the rule the renewals would keep it out for as long as they go on.
func TestElectorTakesTheLeaseFromAForeignHolder(t *testing.T) {
	if testing.Short() {
		t.Skip("needs kube-apiserver")
	}
	ctx, srv, admin := startAPI(t)
	const lease = "meshlet-leader-x"
	leases := admin.CoordinationV1().Leases("kilo-system")
	evil, secs := "evil", int32(3)
	now := metav1.NewMicroTime(time.Now())
	if _, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: lease},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &evil, LeaseDurationSeconds: &secs, RenewTime: &now}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The foreign holder renews while it holds, as a live holder would.
	renewals := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond) // a renewal period, not a synchronisation
		defer tick.Stop()
		for ctx.Err() == nil {
			<-tick.C
			l, err := leases.Get(ctx, lease, metav1.GetOptions{})
			if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != evil {
				return
			}
			renewed := metav1.NewMicroTime(time.Now())
			l.Spec.RenewTime = &renewed
			if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err == nil {
				renewals++
			} else if !apierrors.IsConflict(err) {
				return
			}
		}
	}()

	rec := record.NewFakeRecorder(10)
	e := &Elector{Client: kubernetes.NewForConfigOrDie(srv.ServiceAccountConfig(ctx, "kilo-system", "meshlet")), Namespace: "kilo-system", Identity: "x-1", Recorder: rec,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	e.Start(ctx)
	seg := topology.LocationSegment("x")
	plan := topology.Plan{Leader: true, Segment: seg,
		Segments: []topology.SegmentInfo{{Name: seg, Location: "x", Leader: "x-1", Nodes: []string{"x-1", "x-2"}}},
		Leadership: &topology.Leadership{Location: "x", Lease: lease, Governed: true, Holder: evil, Candidate: true,
			Candidates: []string{"x-1", "x-2"}}}
	if err := e.Follow(ctx, plan, true, time.Now()); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "x-1 holding the Lease", func() bool {
		l, err := leases.Get(ctx, lease, metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == "x-1"
	})
	<-done
	t.Logf("RESULT the foreign holder renewed %d times; x-1 took the Lease over", renewals)
	var events []string
	for len(rec.Events) > 0 {
		events = append(events, <-rec.Events)
	}
	found := false
	for _, ev := range events {
		found = found || strings.Contains(ev, "Warning "+failover.ReasonForeignLeaseHolder+" holder evil is not a Ready node of location x")
	}
	if !found {
		t.Errorf("events %q: want a %s Event naming evil", events, failover.ReasonForeignLeaseHolder)
	}
}
