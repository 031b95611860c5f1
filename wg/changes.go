package wg

import (
	"bufio"
	"errors"
	"fmt"
	"io"
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

// uapiConn is a UAPI connection that publishes the configurations written
// through it. The UAPI (https://www.wireguard.com/xplatform/) frames every
// operation as a line "get=1" or "set=1", key=value lines and an empty
// line, and the device answers each operation once it has handled it;
// wireguard-go's IpcHandle serves the connection unchanged.
//
// The connection does not parse the operations to find the sets: where
// wireguard-go starts its next operation depends on how it buffered the
// stream (after a get with a trailing character, after a set that failed
// half-way or whose lines its scanner read past, after several operations
// sent at once), and a set that the device applied where a parser saw
// none, or applied after the answer a parser published at, would be
// drift nobody notices (FuzzUAPIChangeFeed found both). So the rule is
// the one thing that cannot be misread: an answer is not published only
// when everything the connection carried so far is whole gets, each read
// alone before its answer ("get=1\n\n": what wgctrl and wg(8) send, one
// operation per connection); from the first other exchange on, every
// answer is published (a write of the device follows every change it
// makes: a set always ends with its answer).
type uapiConn struct {
	net.Conn
	publish func(pid int) // the feed's publish
	pid     int

	mu        sync.Mutex
	read      []byte // read since the last answer, while it can still be a whole get
	readSince bool   // something was read since the last answer
	tainted   bool   // an exchange other than a whole get was seen: publish every answer
}

// wholeGet is the only exchange that is not published.
const wholeGet = "get=1\n\n"

func newUAPIConn(c net.Conn, publish func(pid int)) *uapiConn {
	return &uapiConn{Conn: c, publish: publish, pid: peerPID(c), read: make([]byte, 0, len(wholeGet))}
}

func (c *uapiConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		c.readSince = true
		if !c.tainted {
			if len(c.read)+n > len(wholeGet) {
				c.tainted = true
			} else {
				c.read = append(c.read, p[:n]...)
			}
		}
		c.mu.Unlock()
	}
	return n, err
}

// Write is the device's answer to an operation (one or several writes: a
// write with nothing read since the previous one continues an answer).
func (c *uapiConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.mu.Lock()
	if c.readSince && string(c.read) != wholeGet {
		c.tainted = true
	}
	c.read, c.readSince = c.read[:0], false
	publish := c.tainted
	c.mu.Unlock()
	if publish {
		c.publish(c.pid)
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
		readChanges(c, ch, os.Getpid())
	}()
	return &changeSub{C: ch, conn: c}, nil
}

func (s *changeSub) close() { s.conn.Close() }

// readChanges reads the feed's lines from r into ch until r ends: each
// line is a writer's pid, 0 when it is not a number. When ch is full the
// watch is busy reading (it reads again for the next one anyway): the
// line is dropped, unless it is a foreign writer's (not self), which
// replaces one queued.
func readChanges(r io.Reader, ch chan int, self int) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		pid, err := strconv.Atoi(sc.Text())
		if err != nil {
			pid = 0
		}
		select {
		case ch <- pid:
		default:
			if pid != self {
				select {
				case <-ch:
				default:
				}
				ch <- pid
			}
		}
	}
}
