package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/vishvananda/netns"
)

// run runs a command and returns its combined output; the error names the
// command and carries the output, which is what one needs to debug it.
func run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// ipn runs `ip -n NS ...`.
func ipn(ctx context.Context, ns string, args ...string) error {
	_, err := run(ctx, "ip", append([]string{"-n", ns}, args...)...)
	return err
}

// nsExec runs a command inside a network namespace (ip netns exec).
func nsExec(ctx context.Context, ns string, args ...string) (string, error) {
	return run(ctx, "ip", append([]string{"netns", "exec", ns}, args...)...)
}

// nftLoad loads an nftables ruleset (nft -f syntax) inside a namespace.
func nftLoad(ctx context.Context, ns, rules string) error {
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft in %s: %w: %s", ns, err, out)
	}
	return nil
}

// sysctl sets a sysctl inside a namespace.
func sysctl(ctx context.Context, ns, key, value string) error {
	_, err := nsExec(ctx, ns, "sysctl", "-qw", key+"="+value)
	return err
}

// InNetns runs fn on an OS thread switched into the named network
// namespace. Sockets created by fn live in that namespace for good, so a
// listener or a connection made here keeps working from any goroutine.
func InNetns(name string, fn func() error) error {
	target, err := netns.GetFromName(name)
	if err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	// A fresh goroutine whose thread is thrown away if it cannot be switched
	// back: no other goroutine ever runs in the wrong namespace.
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("entering netns %s: %w", name, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: the runtime terminates it with the goroutine.
			errc <- errors.Join(ferr, fmt.Errorf("leaving netns %s: %w", name, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// DialInNetns dials a TCP address from inside a network namespace.
func DialInNetns(ctx context.Context, ns, addr string) (net.Conn, error) {
	var c net.Conn
	err := InNetns(ns, func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

// forwarder copies TCP connections accepted on a listener to a dial
// function; Close stops it and every copied connection.
type forwarder struct {
	l     net.Listener
	dial  func(ctx context.Context) (net.Conn, error)
	mu    sync.Mutex
	conns map[net.Conn]bool
	wg    sync.WaitGroup
	// cut: refuse every connection (the server unreachable from here).
	cut atomic.Bool
}

// setCut cuts (closing every connection) or restores the forwarding.
func (f *forwarder) setCut(v bool) {
	f.cut.Store(v)
	if !v {
		return
	}
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
}

func newForwarder(l net.Listener, dial func(ctx context.Context) (net.Conn, error)) *forwarder {
	f := &forwarder{l: l, dial: dial, conns: map[net.Conn]bool{}}
	f.wg.Add(1)
	go f.serve()
	return f
}

func (f *forwarder) serve() {
	defer f.wg.Done()
	for {
		c, err := f.l.Accept()
		if err != nil {
			return
		}
		if f.cut.Load() {
			c.Close()
			continue
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			up, err := f.dial(context.Background())
			if err != nil {
				c.Close()
				return
			}
			if !f.track(c, up) {
				return
			}
			done := make(chan struct{}, 2)
			pipe := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				done <- struct{}{}
			}
			go pipe(up, c)
			go pipe(c, up)
			<-done
			// One side ended: end both, so the peer of a stopped API
			// server sees the connection drop as it would without us.
			c.Close()
			up.Close()
			<-done
			f.untrack(c, up)
		}()
	}
}

func (f *forwarder) track(cs ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		f.conns[c] = true
	}
	return true
}

func (f *forwarder) untrack(cs ...net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range cs {
		delete(f.conns, c)
	}
}

func (f *forwarder) Close() {
	f.l.Close()
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.conns = nil
	f.mu.Unlock()
	f.wg.Wait()
}

// ForwardIntoNetns listens on the host at listen (e.g. 127.0.0.1:0) and
// forwards every connection to addr inside namespace ns: how the demo
// exposes a node's metrics on the host.
func ForwardIntoNetns(listen, ns, addr string) (string, func(), error) {
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return "", nil, err
	}
	f := newForwarder(l, func(ctx context.Context) (net.Conn, error) { return DialInNetns(ctx, ns, addr) })
	return l.Addr().String(), f.Close, nil
}

// forwardFromNetns listens on addr inside namespace ns and forwards every
// connection to the same address on the host: the API servers listen on
// the host's loopback, and this makes https://127.0.0.1:PORT mean the same
// server inside every node (its certificate names 127.0.0.1), so the
// kubeconfigs and kubeconfig Secrets a user would write work unchanged.
func forwardFromNetns(ns, addr string) (*forwarder, error) {
	var l net.Listener
	err := InNetns(ns, func() error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listening on %s in %s: %w", addr, ns, err)
	}
	f := newForwarder(l, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	})
	return f, nil
}

// nsPIDs lists the processes in a network namespace.
func nsPIDs(ctx context.Context, ns string) []int {
	out, err := run(ctx, "ip", "netns", "pids", ns)
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(out) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids
}

// killNetns kills every process in a namespace (SIGKILL, by PID) and
// deletes it. Teardown: nothing survives a test.
func killNetns(ctx context.Context, ns string) {
	for _, p := range nsPIDs(ctx, ns) {
		if p != os.Getpid() {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
	_, _ = run(ctx, "ip", "netns", "del", ns)
}
