package reconcile

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// stampWG records when every apply happened.
type stampWG struct {
	mu    sync.Mutex
	at    []time.Time
	apply chan struct{}
}

func (s *stampWG) ActOnSessions(context.Context, *topology.SessionActions) error { return nil }
func (s *stampWG) InitiateHandshakes(context.Context) (int, error)               { return 0, nil }

func (s *stampWG) Apply(context.Context, topology.Device) (Changes, error) {
	s.mu.Lock()
	s.at = append(s.at, time.Now())
	s.mu.Unlock()
	select {
	case s.apply <- struct{}{}:
	default:
	}
	return nil, nil
}

func (s *stampWG) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.at)
}

// BenchmarkDebounce measures, on the real clock with a data plane that
// costs nothing, the loop's schedule (leading edge, trailing window): the
// latency of a lone change
// (notified → applied; 20 changes 150 ms apart) and a storm of 200 changes
// 5 ms apart (how many applies, and how long after the last change it was
// applied). The figures are reported as metrics; ns/op is the whole run.
func BenchmarkDebounce(b *testing.B) {
	b.Run("leading", func(b *testing.B) {
		for b.Loop() {
			now := time.Now()
			l, snap, _, _, _ := newLoop(b, now)
			snap.snap.Nodes = twoNodes(now)
			wg := &stampWG{apply: make(chan struct{}, 1)}
			l.WireGuard, l.Clock, l.Debounce, l.runDone = wg, clock.RealClock{}, 100*time.Millisecond, nil
			l.init()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { _ = l.Run(ctx); close(done) }()
			<-wg.apply // the first run
			var lone []time.Duration
			pace := time.NewTicker(150 * time.Millisecond)
			for range 20 {
				<-pace.C
				n := wg.count()
				seen := time.Now()
				l.Notify(seen)
				for wg.count() == n {
					<-wg.apply
				}
				lone = append(lone, time.Since(seen))
			}
			pace.Stop()
			before := wg.count()
			storm := time.NewTicker(5 * time.Millisecond)
			var last time.Time
			for range 200 {
				<-storm.C
				last = time.Now()
				l.Notify(last)
			}
			storm.Stop()
			// The storm's last change is applied by the first run that
			// starts after it.
			var after time.Duration
			for after == 0 {
				<-wg.apply
				wg.mu.Lock()
				if t := wg.at[len(wg.at)-1]; t.After(last) {
					after = t.Sub(last)
				}
				wg.mu.Unlock()
			}
			cancel()
			<-done
			slices.Sort(lone)
			b.ReportMetric(float64(lone[len(lone)/2].Microseconds())/1000, "lone-p50-ms")
			b.ReportMetric(float64(lone[len(lone)-1].Microseconds())/1000, "lone-max-ms")
			b.ReportMetric(float64(wg.count()-before), "storm-applies")
			b.ReportMetric(float64(after.Microseconds())/1000, "storm-last-ms")
		}
	})
}
