package wg

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/utils/clock"
)

// The change feed of a userspace device meshlet hosts.
//
// Neither WireGuard implementation tells anyone that its configuration
// changed: the kernel's generic netlink family has no multicast group, and
// rtnetlink reports links, addresses and routes, not peers; wireguard-go's
// UAPI answers get and set, nothing else. So `wg set kilo0 peer X remove`
// is noticed only by reading the device, and a read costs in proportion to
// the device (every peer, every allowed IP). A device hosted by meshlet
// (startUserspace: in this process or in `meshlet wireguard-userspace`)
// does see every configuration written to it, on its UAPI socket: it
// publishes each one, with the writer's process id, on a second socket,
// ChangesSocket. The agent subscribes and reads the device only when
// someone other than itself wrote to it (Manager.Watch).

// ChangesSocket is where the device iface hosted by meshlet publishes the
// configurations written to it. It is in a directory of SocketDir, not in
// SocketDir itself: wgctrl and wg(8) take every socket there for a device.
func ChangesSocket(iface string) string {
	return filepath.Join(SocketDir, "meshlet", iface+".changes")
}

// changeFeed is the device side: subscribers get one line per
// configuration written, the writer's pid ("0" when unknown).
type changeFeed struct {
	ln *net.UnixListener
	// clock is the device process's (it is not the agent: the agent's
	// clock is its reconcile loop's, docs/architecture.md#one-clock).
	clock clock.PassiveClock

	mu   sync.Mutex
	subs map[net.Conn]bool
}

func listenChanges(iface string) (*changeFeed, error) {
	path := ChangesSocket(iface)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("wg: creating %s: %w", filepath.Dir(path), err)
	}
	_ = os.Remove(path) // left by a device process that died
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("wg: listening on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("wg: %s: %w", path, err)
	}
	f := &changeFeed{ln: ln, clock: clock.RealClock{}, subs: map[net.Conn]bool{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return // closed
			}
			f.mu.Lock()
			f.subs[c] = true
			f.mu.Unlock()
		}
	}()
	return f, nil
}

// publish tells every subscriber that pid wrote a configuration. A
// subscriber that does not take the line at once is dropped (it
// resubscribes, and reads the device when it does).
func (f *changeFeed) publish(pid int) {
	line := []byte(strconv.Itoa(pid) + "\n")
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.subs {
		_ = c.SetWriteDeadline(f.clock.Now().Add(100 * time.Millisecond))
		if _, err := c.Write(line); err != nil {
			c.Close()
			delete(f.subs, c)
		}
	}
}

func (f *changeFeed) close() error {
	err := f.ln.Close() // removes the socket file
	f.mu.Lock()
	for c := range f.subs {
		c.Close()
	}
	f.subs = nil
	f.mu.Unlock()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// uapiConn is a UAPI connection whose operations are followed as they are
// read, so that a set is published once the device answered it. The UAPI
// (https://www.wireguard.com/xplatform/) frames every operation the same
// way: a line "get=1" or "set=1", key=value lines, an empty line; the
// device answers after it applied the whole operation. wireguard-go's
// IpcHandle serves the connection unchanged.
type uapiConn struct {
	net.Conn
	feed *changeFeed
	pid  int

	mu       sync.Mutex
	line     []byte // the start of the current line (enough for "set=1")
	inOp     bool   // between an operation line and its empty line
	setSent  bool   // a set was read; published at its answer
	overflow bool   // the current line is longer than line's capacity
}

func newUAPIConn(c net.Conn, feed *changeFeed) *uapiConn {
	return &uapiConn{Conn: c, feed: feed, pid: peerPID(c), line: make([]byte, 0, 8)}
}

func (c *uapiConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	for _, b := range p[:n] {
		if b != '\n' {
			if len(c.line) < cap(c.line) {
				c.line = append(c.line, b)
			} else {
				c.overflow = true
			}
			continue
		}
		switch {
		case !c.inOp:
			c.inOp = true
			if !c.overflow && string(c.line) == "set=1" {
				c.setSent = true
			}
		case len(c.line) == 0 && !c.overflow:
			c.inOp = false
		}
		c.line, c.overflow = c.line[:0], false
	}
	c.mu.Unlock()
	return n, err
}

func (c *uapiConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.mu.Lock()
	publish := c.setSent
	c.setSent = false
	c.mu.Unlock()
	if publish {
		c.feed.publish(c.pid)
	}
	return n, err
}

// peerPID is the process id of a unix socket's peer (SO_PEERCRED), 0 when
// unknown (a writer in a pid namespace this one cannot see reads as 0 too).
func peerPID(c net.Conn) int {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0
	}
	pid := 0
	_ = raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = int(cred.Pid)
		}
	})
	return pid
}

// changeSub is the agent side: C gets the pid of every writer, and is
// closed when the feed ends (the device process stopped).
type changeSub struct {
	C    <-chan int
	conn net.Conn
}

// subscribeChanges subscribes to the change feed of iface; it fails when
// the device has none (kernel WireGuard, a userspace device meshlet does
// not host, or one started by an older meshlet).
func subscribeChanges(iface string) (*changeSub, error) {
	c, err := net.DialTimeout("unix", ChangesSocket(iface), time.Second)
	if err != nil {
		return nil, err
	}
	ch := make(chan int, 16)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			pid, err := strconv.Atoi(sc.Text())
			if err != nil {
				pid = 0
			}
			select {
			case ch <- pid:
			default:
				// The watch is busy reading: it reads again for the next
				// one anyway; keep a foreign writer rather than our own.
				if pid != os.Getpid() {
					select {
					case <-ch:
					default:
					}
					ch <- pid
				}
			}
		}
	}()
	return &changeSub{C: ch, conn: c}, nil
}

func (s *changeSub) close() { s.conn.Close() }
