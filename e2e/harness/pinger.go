package harness

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"time"
)

// Pinger pings a pod address from a node's pod address for as long as it
// runs, recording when each reply arrived (ping -D): the time traffic
// stopped and resumed, not only how many pings were lost.
type Pinger struct {
	cmd  *exec.Cmd
	done chan struct{}

	mu      sync.Mutex
	started time.Time
	replies []reply
	lastSeq int
}

type reply struct {
	at  time.Time
	seq int
}

// pingReply matches an echo reply line of `ping -D` ("[1764712345.123456]
// 64 bytes from 10.2.0.5: icmp_seq=7 ttl=62 time=0.5 ms") and not an ICMP
// error line ("[…] From 172.20.0.11 icmp_seq=7 Destination Net
// Unreachable"): a router on the way answering that it has no route is
// not the destination answering.
var pingReply = regexp.MustCompile(`^\[(\d+)\.(\d+)\] \d+ bytes from [^ ]+: icmp_seq=(\d+) `)

// StartPinger starts pinging dst from n every interval (each reply waited
// for up to a second).
func (n *Node) StartPinger(ctx context.Context, dst netip.Addr, interval time.Duration) (*Pinger, error) {
	return startPinger(ctx, "node "+n.Name, n.NS, n.podIP(dst), dst, interval)
}

// StartPinger starts pinging dst from the peer host's mesh address every
// interval.
func (h *PeerHost) StartPinger(ctx context.Context, dst netip.Addr, interval time.Duration) (*Pinger, error) {
	return startPinger(ctx, "peer host "+h.Name, h.NS, h.Addr, dst, interval)
}

func startPinger(ctx context.Context, who, ns string, src, dst netip.Addr, interval time.Duration) (*Pinger, error) {
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "ping", "-n", "-D", "-i", fmt.Sprintf("%.3f", interval.Seconds()),
		"-W", "1", "-I", src.String(), dst.String())
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p := &Pinger{cmd: cmd, done: make(chan struct{}), started: time.Now()}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: ping %s: %w", who, dst, err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			m := pingReply.FindStringSubmatch(sc.Text())
			if m == nil {
				continue
			}
			sec, _ := strconv.ParseInt(m[1], 10, 64)
			frac := m[2] + "000000000"
			nsec, _ := strconv.ParseInt(frac[:9], 10, 64)
			seq, _ := strconv.Atoi(m[3])
			p.mu.Lock()
			p.replies = append(p.replies, reply{at: time.Unix(sec, nsec), seq: seq})
			p.lastSeq = max(p.lastSeq, seq)
			p.mu.Unlock()
		}
		_ = cmd.Wait()
	}()
	return p, nil
}

// Stop ends the ping and returns what it saw.
func (p *Pinger) Stop() PingTimeline {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
	}
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	t := PingTimeline{Started: p.started, Stopped: time.Now(), Replies: make([]time.Time, len(p.replies)),
		Seqs: make([]int, len(p.replies))}
	seen := map[int]bool{}
	for i, r := range p.replies {
		t.Replies[i] = r.at
		t.Seqs[i] = r.seq
		seen[r.seq] = true
	}
	// Requests up to the last answered one that got no answer.
	for s := 1; s <= p.lastSeq; s++ {
		if !seen[s] {
			t.Lost++
		}
	}
	t.Sent = p.lastSeq
	return t
}

// Replied reports whether a reply arrived after t.
func (p *Pinger) Replied(after time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.replies) > 0 && p.replies[len(p.replies)-1].at.After(after)
}

// PingTimeline is one Pinger's run.
type PingTimeline struct {
	Started, Stopped time.Time
	Replies          []time.Time
	// Seqs are the replies' sequence numbers (Replies[i] answered Seqs[i]).
	Seqs []int
	// Sent counts requests up to the last answered one, Lost those of them
	// that got no reply.
	Sent, Lost int
}

// FirstReplyAfter is the first reply after t (zero: none).
func (t PingTimeline) FirstReplyAfter(at time.Time) time.Time {
	for _, r := range t.Replies {
		if r.After(at) {
			return r
		}
	}
	return time.Time{}
}

// LastReplyBefore is the last reply before t (zero: none).
func (t PingTimeline) LastReplyBefore(at time.Time) time.Time {
	var last time.Time
	for _, r := range t.Replies {
		if r.Before(at) {
			last = r
		}
	}
	return last
}

// LongestGap is the longest time between two replies (or from the start
// to the first).
func (t PingTimeline) LongestGap() time.Duration {
	prev := t.Started
	var g time.Duration
	for _, r := range t.Replies {
		g = max(g, r.Sub(prev))
		prev = r
	}
	return g
}

// WindowStats is what a ping saw in a window of time.
type WindowStats struct {
	// Gap is the longest time without a reply among the gaps that overlap
	// the window (whole, also when one reaches past it), GapFrom the reply
	// it began after.
	Gap     time.Duration
	GapFrom time.Time
	// Sent counts the requests sent in the window, Lost those of them
	// that got no reply.
	Sent, Lost int
}

// Window is what the ping saw between from and to. A lost request's send
// time is interpolated between the replies to its neighbours by sequence
// number (requests leave at a steady rate).
func (t PingTimeline) Window(from, to time.Time) WindowStats {
	var w WindowStats
	gap := func(a, b time.Time) {
		if d := b.Sub(a); d > w.Gap {
			w.Gap, w.GapFrom = d, a
		}
	}
	prev := t.Started
	for _, r := range t.Replies {
		if r.After(from) && prev.Before(to) {
			gap(prev, r)
		}
		prev = r
	}
	if prev.Before(to) && t.Stopped.After(from) {
		gap(later(prev, from), earlier(t.Stopped, to))
	}
	bySeq := map[int]time.Time{0: t.Started}
	last := 0
	for i, s := range t.Seqs {
		if _, dup := bySeq[s]; !dup {
			bySeq[s] = t.Replies[i]
		}
		last = max(last, s)
	}
	prevSeq := 0
	for s := 1; s <= last; s++ {
		at, ok := bySeq[s]
		if ok {
			prevSeq = s
		} else {
			next := s + 1
			for ; next <= last; next++ {
				if _, ok := bySeq[next]; ok {
					break
				}
			}
			a, b := bySeq[prevSeq], bySeq[next]
			at = a.Add(time.Duration(float64(b.Sub(a)) * float64(s-prevSeq) / float64(next-prevSeq)))
		}
		if at.Before(from) || !at.Before(to) {
			continue
		}
		w.Sent++
		if !ok {
			w.Lost++
		}
	}
	return w
}
