package apiserver

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"
)

// DelayLine is a TCP proxy that delays everything the server sends by a
// settable latency (a slow link, or a server answering slowly: order and
// throughput kept; what the client sends goes through at once).
type DelayLine struct {
	l        net.Listener
	delay    atomic.Int64 // nanoseconds
	accepted atomic.Int64
}

// NewDelayLine listens on a free loopback port and proxies each
// connection to target until ctx ends or Close.
func NewDelayLine(ctx context.Context, target string) (*DelayLine, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("delay line to %s: %w", target, err)
	}
	d := &DelayLine{l: l}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			d.accepted.Add(1)
			go d.serve(ctx, conn, target)
		}
	}()
	return d, nil
}

// Addr is the proxy's host:port.
func (d *DelayLine) Addr() string { return d.l.Addr().String() }

// Close stops accepting connections.
func (d *DelayLine) Close() error { return d.l.Close() }

// Accepted is how many connections the line took so far.
func (d *DelayLine) Accepted() int64 { return d.accepted.Load() }

// SetDelay sets the latency added from now on (0: none).
func (d *DelayLine) SetDelay(v time.Duration) { d.delay.Store(int64(v)) }

type chunk struct {
	due time.Time
	b   []byte
}

// serve copies one connection: client → server as it comes, server →
// client through the delay line.
func (d *DelayLine) serve(ctx context.Context, c net.Conn, target string) {
	defer c.Close()
	var dialer net.Dialer
	up, err := dialer.DialContext(ctx, "tcp", target)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 3)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	line := make(chan chunk, 1024)
	go func() {
		defer close(line)
		for {
			b := make([]byte, 32<<10)
			n, err := up.Read(b)
			if n > 0 {
				line <- chunk{due: time.Now().Add(time.Duration(d.delay.Load())), b: b[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		for ch := range line {
			if w := time.Until(ch.due); w > 0 {
				t := time.NewTimer(w)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
			}
			if _, err := c.Write(ch.b); err != nil {
				return
			}
		}
	}()
	<-done
}
