// Package apiserver starts real etcd + kube-apiserver processes on loopback
// for tests: no kubelet, no controller-manager, just the API (Nodes can be
// created and patched directly, RBAC is enforced, CRDs work).
//
// Binaries come from $MESHLET_K8S_BIN (a directory with kube-apiserver and
// etcd), else from hack/k8s/ensure.sh, which builds and caches them. When
// neither works the test is skipped, unless CI=true, where it fails: CI must
// never pass by skipping the integration tests.
//
// Typical use:
//
//	srv := apiserver.Start(t, apiserver.Options{})
//	cs := kubernetes.NewForConfigOrDie(srv.AdminConfig())
//	srv.Stop(); srv.Start() // simulate an API outage
package apiserver

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/csv"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// User is a static token user of the API server (token auth file). Tokens are
// generated; groups are sent as the user's groups (RBAC subjects of kind
// Group match them).
type User struct {
	Name   string
	Groups []string
}

// Options configures a server. The zero value is fine.
type Options struct {
	// Users are extra token users, besides the admin (group system:masters).
	Users []User
	// ExtraArgs are appended to kube-apiserver's command line.
	ExtraArgs []string
	// ReadyTimeout bounds each wait for /readyz (default 90 s: a cold start
	// takes ~3 s, more on a loaded CI machine running several servers).
	ReadyTimeout time.Duration
	// SlowEtcd puts a DelayLine between kube-apiserver and etcd
	// (Server.Etcd sets its latency): a slow etcd.
	SlowEtcd bool
}

// Server is one etcd + kube-apiserver pair. Its methods are safe to call from
// the test goroutine; Stop and Start must not race each other.
type Server struct {
	t    tb
	opts Options
	dir  string
	bins binaries

	etcdPort, etcdPeerPort, apiPort int

	caPEM  []byte
	tokens map[string]string // user name -> token
	groups map[string][]string
	mu     sync.Mutex
	// restarts are the windows from Stop to Start's readiness: a request
	// then may be refused while RBAC's caches fill (Forbidden skips them).
	restarts [][2]time.Time
	etcd     *proc
	kubeAPI  *proc
	etcdLine *DelayLine // with Options.SlowEtcd
}

// Etcd is the delay line kube-apiserver reaches etcd through, nil
// without Options.SlowEtcd.
func (s *Server) Etcd() *DelayLine { return s.etcdLine }

const adminUser = "admin"

// tb is the part of testing.TB a Server uses after it started, so a
// program that is not a test (the demo) can run one through StartServer.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Failed() bool
}

// Start starts etcd and kube-apiserver, waits until /readyz answers OK and
// registers a cleanup that kills both (by PID) when the test ends, passed or
// failed. It skips or fails the test when the binaries cannot be found (see
// the package comment).
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	bins := findBinaries(t)
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 90 * time.Second
	}
	s := &Server{
		t:      t,
		opts:   opts,
		dir:    t.TempDir(),
		bins:   bins,
		tokens: map[string]string{},
		groups: map[string][]string{},
	}
	// Registered after TempDir, so it runs before the directory is removed.
	t.Cleanup(s.kill)
	if err := s.setup(); err != nil {
		t.Fatalf("apiserver: %v", err)
	}
	// A port picked free can be taken by someone else before our process
	// binds it; retry with new ports a few times in that case.
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if err = s.pickPorts(); err != nil {
			break
		}
		start := time.Now()
		if err = s.start(); err == nil {
			t.Logf("apiserver: ready at %s in %s (dir %s)", s.URL(), time.Since(start).Round(time.Millisecond), s.dir)
			return s
		}
		s.kill()
		if !errors.Is(err, errAddrInUse) {
			break
		}
		t.Logf("apiserver: port conflict, retrying: %v", err)
	}
	t.Fatalf("apiserver: %v", err)
	return nil
}

// URL is the API server's https URL.
func (s *Server) URL() string { return fmt.Sprintf("https://127.0.0.1:%d", s.apiPort) }

// Dir is the server's work directory (logs: etcd.log, kube-apiserver.log).
func (s *Server) Dir() string { return s.dir }

// CAData is the PEM CA that signed the serving certificate.
func (s *Server) CAData() []byte { return append([]byte(nil), s.caPEM...) }

// AdminConfig returns a config for a cluster admin (group system:masters).
func (s *Server) AdminConfig() *rest.Config { return s.tokenConfig(s.tokens[adminUser]) }

// UserConfig returns a config for a token user declared in Options.Users.
func (s *Server) UserConfig(name string) *rest.Config {
	tok, ok := s.tokens[name]
	if !ok || name == adminUser {
		s.t.Fatalf("apiserver: no token user %q (declare it in Options.Users)", name)
	}
	return s.tokenConfig(tok)
}

// TokenConfig returns a config that authenticates with a bearer token, e.g.
// one from ServiceAccountToken.
func (s *Server) TokenConfig(token string) *rest.Config { return s.tokenConfig(token) }

// ImpersonateConfig returns an admin config that impersonates user with
// groups: any user name, no restart needed; RBAC is evaluated for the
// impersonated identity.
func (s *Server) ImpersonateConfig(user string, groups ...string) *rest.Config {
	c := s.AdminConfig()
	c.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return c
}

func (s *Server) tokenConfig(token string) *rest.Config {
	return &rest.Config{
		Host:            s.URL(),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: s.CAData()},
		// Tests create many objects quickly; client-go's default 5 QPS
		// would make them slow for no benefit against a private server.
		QPS:   1000,
		Burst: 1000,
	}
}

// Stop stops kube-apiserver and etcd (etcd's data is kept). Clients see
// connection refused until Start. Used to simulate an API outage.
func (s *Server) Stop() {
	s.t.Helper()
	start := time.Now()
	defer func() { s.t.Logf("apiserver: stopped in %s", time.Since(start).Round(time.Millisecond)) }()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.restarts = append(s.restarts, [2]time.Time{start})
	// kube-apiserver first, so it does not log a storm of etcd errors.
	for _, p := range []*proc{s.kubeAPI, s.etcd} {
		if p != nil {
			p.stop(10 * time.Second)
		}
	}
	s.kubeAPI, s.etcd = nil, nil
}

// Start starts a stopped server again on the same ports with the same etcd
// data, and waits until it is ready.
func (s *Server) Start() {
	s.t.Helper()
	start := time.Now()
	if err := s.start(); err != nil {
		s.t.Fatalf("apiserver: restart: %v", err)
	}
	s.mu.Lock()
	if n := len(s.restarts); n > 0 {
		s.restarts[n-1][1] = time.Now()
	}
	s.mu.Unlock()
	s.t.Logf("apiserver: restarted in %s", time.Since(start).Round(time.Millisecond))
}

func (s *Server) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kubeAPI != nil && s.t.Failed() {
		// Before stopping: afterwards the log ends in shutdown noise.
		s.t.Logf("apiserver: last lines of %s:\n%s", s.kubeAPI.log, tail(s.kubeAPI.log, 30))
	}
	for _, p := range []*proc{s.kubeAPI, s.etcd} {
		if p != nil {
			p.stop(5 * time.Second)
		}
	}
	s.kubeAPI, s.etcd = nil, nil
	if s.etcdLine != nil {
		_ = s.etcdLine.Close()
		s.etcdLine = nil
	}
}

// setup writes the certificates, keys and token file.
func (s *Server) setup() error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "meshlet-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	s.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})

	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	if err := writePEM(s.path("serving.crt"), "CERTIFICATE", srvDER); err != nil {
		return err
	}
	if err := writeKey(s.path("serving.key"), srvKey); err != nil {
		return err
	}
	// Service-account signing key: lets tests mint real SA tokens with the
	// TokenRequest API (ServiceAccountToken), as a user would for a remote
	// cluster's kubeconfig.
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	if err := writeKey(s.path("sa.key"), saKey); err != nil {
		return err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	if err := writePEM(s.path("sa.pub"), "PUBLIC KEY", saPub); err != nil {
		return err
	}

	// Token auth file: token,user,uid,"group1,group2"
	var buf bytes.Buffer
	w := csv.NewWriter(&buf)
	users := append([]User{{Name: adminUser, Groups: []string{"system:masters"}}}, s.opts.Users...)
	for _, u := range users {
		if _, dup := s.tokens[u.Name]; dup {
			return fmt.Errorf("user %q declared twice", u.Name)
		}
		tok := randomHex(16)
		s.tokens[u.Name] = tok
		s.groups[u.Name] = u.Groups
		rec := []string{tok, u.Name, u.Name}
		if len(u.Groups) > 0 {
			rec = append(rec, strings.Join(u.Groups, ","))
		}
		if err := w.Write(rec); err != nil {
			return err
		}
	}
	w.Flush()
	if err := os.WriteFile(s.path("tokens.csv"), buf.Bytes(), 0o600); err != nil {
		return err
	}
	return os.WriteFile(s.path("audit-policy.yaml"), []byte(auditPolicy), 0o600)
}

// auditPolicy records every request of a ServiceAccount (meshlet's agents
// and remote credentials are ServiceAccounts) with its response code, so
// a test can prove the shipped RBAC is enough: Forbidden.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts"]
- level: None
`

func (s *Server) pickPorts() error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	s.etcdPort, s.etcdPeerPort, s.apiPort = ports[0], ports[1], ports[2]
	return nil
}

var errAddrInUse = errors.New("address already in use")

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.etcd != nil || s.kubeAPI != nil {
		return errors.New("already running")
	}
	deadline := time.Now().Add(s.opts.ReadyTimeout)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", s.etcdPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", s.etcdPeerPort)
	etcd, err := startProc(s.bins.etcd, s.path("etcd.log"),
		"--name=default",
		"--data-dir="+s.path("etcd-data"),
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL,
		// Test data: durability is not needed, fsync would dominate latency.
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	if err != nil {
		return err
	}
	s.etcd = etcd
	if err := waitHTTP(deadline, etcd, etcdURL+"/health", nil); err != nil {
		return fmt.Errorf("etcd: %w", err)
	}

	apiEtcd := etcdURL
	if s.opts.SlowEtcd {
		if s.etcdLine == nil {
			if s.etcdLine, err = NewDelayLine(context.Background(), fmt.Sprintf("127.0.0.1:%d", s.etcdPort)); err != nil {
				return err
			}
		}
		apiEtcd = "http://" + s.etcdLine.Addr()
	}
	args := []string{
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(s.apiPort),
		"--etcd-servers=" + apiEtcd,
		"--tls-cert-file=" + s.path("serving.crt"),
		"--tls-private-key-file=" + s.path("serving.key"),
		"--cert-dir=" + s.path("certs"),
		"--token-auth-file=" + s.path("tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-key-file=" + s.path("sa.pub"),
		"--service-account-signing-key-file=" + s.path("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-cluster-ip-range=10.0.0.0/24",
		// Without it kube-apiserver refuses to advertise 127.0.0.1 (it would
		// write that address into the kubernetes Endpoints).
		"--endpoint-reconciler-type=none",
		// The ServiceAccount admission plugin waits for a token controller
		// that does not run here (no controller-manager).
		"--disable-admission-plugins=ServiceAccount",
		"--enable-priority-and-fairness=false",
		// As kubeadm and Talos set it: DaemonSets like meshlet's (hostNetwork,
		// NET_ADMIN) are otherwise refused "by cluster policy".
		"--allow-privileged=true",
		"--profiling=false",
		"--audit-policy-file=" + s.path("audit-policy.yaml"),
		"--audit-log-path=" + s.path("audit.log"),
		"--v=1",
	}
	args = append(args, s.opts.ExtraArgs...)
	api, err := startProc(s.bins.kubeAPIServer, s.path("kube-apiserver.log"), args...)
	if err != nil {
		return err
	}
	s.kubeAPI = api
	if err := waitHTTP(deadline, api, s.URL()+"/readyz", s.AdminConfig()); err != nil {
		return fmt.Errorf("kube-apiserver: %w\n%s", err, tail(api.log, 20))
	}
	return nil
}

func (s *Server) path(name string) string { return filepath.Join(s.dir, name) }

// proc is a child process whose log goes to a file.
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process has exited
	err  error         // Wait's result, valid after done
}

func startProc(bin, logPath string, args ...string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// If the test binary dies (panic, timeout, SIGKILL), the kernel
		// kills the servers too instead of leaving them running.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	p := &proc{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// stop sends SIGTERM, then SIGKILL after grace, and waits for the exit.
func (p *proc) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// waitHTTP polls url until it answers 200, the process exits, or deadline.
func waitHTTP(deadline time.Time, p *proc, url string, cfg *rest.Config) error {
	client := &http.Client{Timeout: 2 * time.Second}
	if cfg != nil {
		rt, err := rest.TransportFor(cfg)
		if err != nil {
			return err
		}
		client.Transport = rt
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		cancel()
		if err == nil {
			body := make([]byte, 512)
			n, _ := resp.Body.Read(body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, body[:n])
		} else {
			last = err.Error()
		}
		select {
		case <-p.done:
			if strings.Contains(tail(p.log, 50), "address already in use") {
				return fmt.Errorf("exited: %v: %w", p.err, errAddrInUse)
			}
			return fmt.Errorf("exited before ready: %v\n%s", p.err, tail(p.log, 20))
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready at deadline (last: %s)", last)
		}
	}
}

// freePorts returns n distinct ports that were free a moment ago. All n
// listeners are open at once so the kernel cannot hand out a port twice.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func writeKey(path string, k *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der)
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func tail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}
