package harness

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"
)

// DataPlaneWatch samples nodes' WireGuard peers and meshlet's routes while a
// scenario runs and records everything that was there at the start and went
// missing at some sample ("nothing removed from the data plane"), and how
// often each peer's session was re-created (its last handshake changed).
type DataPlaneWatch struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu         sync.Mutex
	base       map[string]map[string]bool // node → items at the start
	missing    map[[2]string]time.Time    // {node, item} → first sample it was missing
	handshakes map[string]map[time.Time]bool
	samples    int
	errs       int
}

// WatchDataPlane starts sampling nodes every interval; the items present
// in the first sample are the baseline.
func WatchDataPlane(ctx context.Context, interval time.Duration, nodes ...*Node) *DataPlaneWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &DataPlaneWatch{cancel: cancel, done: make(chan struct{}), base: map[string]map[string]bool{},
		missing: map[[2]string]time.Time{}, handshakes: map[string]map[time.Time]bool{}}
	for _, n := range nodes {
		items, _, err := w.read(ctx, n)
		if err == nil {
			w.base[n.Name] = items
		}
	}
	go func() {
		defer close(w.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for _, n := range nodes {
				w.sample(ctx, n)
			}
		}
	}()
	return w
}

// read lists a node's data plane items: "peer KEY" and "route LINE".
func (w *DataPlaneWatch) read(ctx context.Context, n *Node) (map[string]bool, map[string]time.Time, error) {
	items := map[string]bool{}
	hs := map[string]time.Time{}
	d, err := n.Device()
	if err != nil || d == nil {
		return nil, nil, fmt.Errorf("node %s: device: %v", n.Name, err)
	}
	for k, p := range d.Peers {
		items["peer "+k] = true
		hs[k] = p.LastHandshake
	}
	rs, err := n.Routes(ctx)
	if err != nil {
		return nil, nil, err
	}
	for _, r := range rs {
		items["route "+r] = true
	}
	return items, hs, nil
}

func (w *DataPlaneWatch) sample(ctx context.Context, n *Node) {
	items, hs, err := w.read(ctx, n)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			w.errs++
		}
		return
	}
	w.samples++
	for it := range w.base[n.Name] {
		if !items[it] {
			k := [2]string{n.Name, it}
			if _, seen := w.missing[k]; !seen {
				w.missing[k] = time.Now()
			}
		}
	}
	for k, t := range hs {
		if t.IsZero() {
			continue
		}
		key := n.Name + " → " + k
		if w.handshakes[key] == nil {
			w.handshakes[key] = map[time.Time]bool{}
		}
		w.handshakes[key][t] = true
	}
}

// DataPlaneResult is what a DataPlaneWatch saw.
type DataPlaneResult struct {
	// Removed lists the baseline items found missing, with when first.
	Removed []string
	// Handshakes counts, per node and peer, the distinct handshakes seen
	// (1 = the same session throughout).
	Handshakes map[string]int
	Samples    int
	Errors     int
}

// Stop ends the sampling; allowed says which missing items were expected
// (the scenario removed them on purpose).
func (w *DataPlaneWatch) Stop(allowed func(node, item string) bool) DataPlaneResult {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	r := DataPlaneResult{Handshakes: map[string]int{}, Samples: w.samples, Errors: w.errs}
	for k, at := range w.missing {
		if allowed != nil && allowed(k[0], k[1]) {
			continue
		}
		r.Removed = append(r.Removed, fmt.Sprintf("%s: %s (at %s)", k[0], k[1], at.Format("15:04:05.000")))
	}
	sort.Strings(r.Removed)
	for k, ts := range w.handshakes {
		r.Handshakes[k] = len(ts)
	}
	return r
}

// SessionsRecreated is how many new sessions appeared beyond the first of
// each peer.
func (r DataPlaneResult) SessionsRecreated() int {
	n := 0
	for _, c := range r.Handshakes {
		if c > 1 {
			n += c - 1
		}
	}
	return n
}
