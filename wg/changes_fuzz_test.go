package wg

import (
	"bytes"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun/tuntest"
)

// Fuzz targets for what meshlet reads from WireGuard's sockets. Their seed
// corpus runs in plain `go test`; explore further with (one at a time)
//
//	go test -run='^$' -fuzz='^FuzzUAPIChangeFeed$' -parallel=1 ./wg/
//
// (docs/security.md#fuzzing has each target's command and figures).

// nopBind is a conn.Bind that sends and receives nothing: a fuzzed device
// opens no socket. Endpoints parse as the standard bind parses them.
type nopBind struct {
	conn.Bind // the standard bind, for ParseEndpoint only
	mu        sync.Mutex
	closed    chan struct{}
}

func newNopBind() *nopBind { return &nopBind{Bind: conn.NewStdNetBind()} }

func (b *nopBind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	closed := make(chan struct{})
	b.closed = closed
	recv := func([][]byte, []int, []conn.Endpoint) (int, error) {
		<-closed
		return 0, net.ErrClosed
	}
	return []conn.ReceiveFunc{recv}, port, nil
}

func (b *nopBind) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed != nil {
		close(b.closed)
		b.closed = nil
	}
	return nil
}

func (b *nopBind) SetMark(uint32) error                          { return nil }
func (b *nopBind) Send([][]byte, conn.Endpoint) error            { return nil }
func (b *nopBind) BatchSize() int                                { return 1 }
func (b *nopBind) ParseEndpoint(s string) (conn.Endpoint, error) { return b.Bind.ParseEndpoint(s) }

// newFuzzDevice is a wireguard-go device on a channel TUN and nopBind.
func newFuzzDevice() *device.Device {
	return device.NewDevice(tuntest.NewChannelTUN().TUN(), newNopBind(), device.NewLogger(device.LogLevelSilent, ""))
}

// deviceConfig is what a set can change on dev: its get=1 answer without
// the counters and handshake times, peers in key order (the device lists
// them in map order).
func deviceConfig(dev *device.Device) string {
	s, err := dev.IpcGet()
	if err != nil {
		panic(err) // a get cannot fail
	}
	var head string
	var peers []string
	for _, l := range strings.Split(s, "\n") {
		if l == "" || strings.HasPrefix(l, "last_handshake_time") || strings.HasPrefix(l, "tx_bytes=") || strings.HasPrefix(l, "rx_bytes=") {
			continue
		}
		switch {
		case strings.HasPrefix(l, "public_key="):
			peers = append(peers, l+"\n")
		case len(peers) > 0:
			peers[len(peers)-1] += l + "\n"
		default:
			head += l + "\n"
		}
	}
	slices.Sort(peers)
	return head + strings.Join(peers, "")
}

// steppedConn is the device's end of a UAPI connection fed chunk by chunk:
// the test hands over the next chunk only once the device asks for more
// (it then has handled everything before), so a run is deterministic.
type steppedConn struct {
	net.Conn // nil: only what IpcHandle calls is implemented
	chunks   chan []byte
	waiting  chan struct{} // a Read found nothing pending
	pending  []byte
	eof      bool
	answers  bytes.Buffer
}

func (c *steppedConn) Read(p []byte) (int, error) {
	if c.eof {
		return 0, io.EOF
	}
	if len(c.pending) == 0 {
		c.waiting <- struct{}{}
		chunk, ok := <-c.chunks
		if !ok {
			c.eof = true
			return 0, io.EOF
		}
		c.pending = chunk
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

func (c *steppedConn) Write(p []byte) (int, error) { return c.answers.Write(p) }
func (c *steppedConn) Close() error                { return nil }

// uapiSeeds are UAPI exchanges as the e2e runs make them: wgctrl's get and
// set (meshlet's applies: a peer per remote leader, keepalive 25, the
// e2e clusters' networks), wg(8)'s remove, and malformed operations.
func uapiSeeds() []string {
	k1 := "0101010101010101010101010101010101010101010101010101010101010101"
	k2 := "0202020202020202020202020202020202020202020202020202020202020202"
	set := "set=1\nprivate_key=" + strings.Repeat("a8", 32) + "\nlisten_port=51820\n" +
		"public_key=" + k1 + "\nendpoint=198.51.100.7:51820\npersistent_keepalive_interval=25\nreplace_allowed_ips=true\n" +
		"allowed_ip=10.2.0.0/16\nallowed_ip=100.66.1.1/32\n" +
		"public_key=" + k2 + "\nendpoint=[2001:db8::2]:51821\nallowed_ip=10.5.0.1/32\n\n"
	return []string{
		"get=1\n\n",
		set,
		"set=1\npublic_key=" + k1 + "\nremove=true\n\n",
		"get=1\n\n" + set + "get=1\n\n",
		"get=1\nXset=1\nlisten_port=1\n\n",
		"set=1\nbad\nset=1\nlisten_port=2\n\n",
		"set=1\nlisten_port=3\n",
		"set=1\r\nlisten_port=4\n\n",
		"hello\n\nset=1\nlisten_port=5\n\n",
	}
}

// FuzzUAPIChangeFeed: whatever a process writes to the UAPI socket of a
// device meshlet hosts (in whatever pieces), every change the device made
// to its configuration is published on the change feed after it was made
// (the agent reads the device on a foreign writer's publish, so an
// unpublished change would be drift nobody notices until the backstop
// read). The oracle is wireguard-go's own IpcHandle.
func FuzzUAPIChangeFeed(f *testing.F) {
	for i, s := range uapiSeeds() {
		f.Add([]byte(s), []byte{byte(i), 7, 1, 200})
		f.Add([]byte(s), []byte(nil))
	}
	f.Fuzz(func(t *testing.T, stream, cuts []byte) {
		r := runUAPI(t, stream, cuts)
		if r.final != r.published {
			t.Fatalf("a change was not published (%d publishes):\npublished:\n%s\ndevice:\n%s", r.publishes, r.published, r.final)
		}
	})
}

type uapiRun struct {
	publishes        int
	published, final string // the configuration at the last publish (or the start), at the end
}

// runUAPI writes stream to a fresh device through a uapiConn, in pieces of
// 1+cuts[i] bytes (the rest at once), each once the device asks for more.
func runUAPI(t *testing.T, stream, cuts []byte) uapiRun {
	dev := newFuzzDevice()
	defer dev.Close()
	sc := &steppedConn{chunks: make(chan []byte), waiting: make(chan struct{})}
	r := uapiRun{published: deviceConfig(dev)}
	uc := newUAPIConn(sc, func(int) {
		r.publishes++
		r.published = deviceConfig(dev)
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		dev.IpcHandle(uc)
	}()
	// next waits until the device asks for more; false when it closed
	// the connection instead.
	next := func() bool {
		select {
		case <-sc.waiting:
			return true
		case <-done:
			return false
		}
	}
	for len(stream) > 0 && next() {
		n := len(stream)
		if len(cuts) > 0 {
			n = min(n, 1+int(cuts[0]))
			cuts = cuts[1:]
		}
		sc.chunks <- stream[:n]
		stream = stream[n:]
	}
	if next() {
		close(sc.chunks)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("IpcHandle did not return")
	}
	r.final = deviceConfig(dev)
	return r
}

// TestUAPIConnPublishes: the exchanges FuzzUAPIChangeFeed found unpublished
// (testdata/fuzz/FuzzUAPIChangeFeed) are published after the change, and
// whole gets, what the agent's own reads and wg show send, are not
// published at all.
func TestUAPIConnPublishes(t *testing.T) {
	seeds := uapiSeeds()
	for _, c := range []struct {
		name        string
		stream      string
		cuts        []byte
		noPublishes bool
	}{
		{"a whole get", "get=1\n\n", nil, true},
		{"a whole get in pieces", "get=1\n\n", []byte{1, 0, 0}, true},
		{"a set", seeds[1], nil, false},
		// The device takes the set after a get's trailing character.
		{"get with a trailing character", "get=1\nXset=1\nlisten_port=1\n\n", nil, false},
		// A get and a set in one write: the get's answer came before the set.
		{"pipelined get and set", seeds[3], nil, false},
		// The first set fails at "bad"; the second, sent after its
		// answer, is applied.
		{"a set after a failed one", seeds[5], []byte{9}, false},
		{"an unterminated set", "set=1\nlisten_port=3\n", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runUAPI(t, []byte(c.stream), c.cuts)
			if r.final != r.published {
				t.Fatalf("unpublished change (%d publishes):\n%s", r.publishes, r.final)
			}
			if c.noPublishes != (r.publishes == 0) {
				t.Fatalf("%d publishes", r.publishes)
			}
		})
	}
}

// FuzzChangeSubscriber: the agent's reader of the change feed takes any
// bytes; every line is a pid (0 when not a number) and none is lost while
// the watch keeps up; while it does not, the last foreign writer is kept.
func FuzzChangeSubscriber(f *testing.F) {
	self := os.Getpid()
	for _, s := range []string{"", "0\n", strconv.Itoa(self) + "\n4242\n", "12\n13", "x\n-1\n\n99999999999999999999\n", "\r\n1\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want []int
		lines := strings.Split(string(b), "\n")
		if len(lines) > 0 && lines[len(lines)-1] == "" {
			lines = lines[:len(lines)-1]
		}
		for _, l := range lines {
			if len(l) >= 64*1024 {
				return // longer than a Scanner's line: the feed ends there
			}
			l = strings.TrimSuffix(l, "\r")
			pid, err := strconv.Atoi(l)
			if err != nil {
				pid = 0
			}
			want = append(want, pid)
		}
		ch := make(chan int, len(want)+1) // a watch that keeps up
		readChanges(bytes.NewReader(b), ch, self)
		close(ch)
		var got []int
		for pid := range ch {
			got = append(got, pid)
		}
		if len(got) != len(want) {
			t.Fatalf("%q: %v, want %v", b, got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%q: %v, want %v", b, got, want)
			}
		}
		// A watch that is busy reading: the reader never blocks, and
		// the one pid it keeps queued is the last foreign writer's.
		busy := make(chan int, 1)
		readChanges(bytes.NewReader(b), busy, self)
		close(busy)
		if len(want) == 0 {
			if len(busy) != 0 {
				t.Fatalf("%q: %d queued, want none", b, len(busy))
			}
			return
		}
		kept := want[0]
		for _, pid := range want[1:] {
			if pid != self {
				kept = pid
			}
		}
		if pid := <-busy; pid != kept {
			t.Fatalf("%q: %d queued, want %d", b, pid, kept)
		}
	})
}
