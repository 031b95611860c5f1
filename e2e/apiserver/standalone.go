package apiserver

import (
	"errors"
	"fmt"
	"os"
	"time"
)

// StartServer is Start for programs that are not tests (e.g. `make demo`):
// it returns an error instead of failing a test, logs through logf, and the
// caller must call Close. Methods that fail a test under Start (Start after
// Stop, ServiceAccountConfig, WriteKubeconfig, UserConfig) panic with a
// *FatalError instead; errors-returning variants (ServiceAccountToken,
// the package-level WriteKubeconfig) avoid that.
func StartServer(opts Options, logf func(format string, args ...any)) (*Server, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	dir, err := BinDir()
	if err != nil {
		return nil, fmt.Errorf("apiserver: no Kubernetes binaries (set MESHLET_K8S_BIN or run hack/k8s/ensure.sh): %w", err)
	}
	var b binaries
	b.dir = dir
	for _, x := range []struct {
		name string
		dst  *string
	}{{"kube-apiserver", &b.kubeAPIServer}, {"kubectl", &b.kubectl}, {"etcd", &b.etcd}} {
		p, err := Bin(x.name)
		if err != nil {
			return nil, err
		}
		*x.dst = p
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 90 * time.Second
	}
	work, err := os.MkdirTemp("", "meshlet-apiserver-")
	if err != nil {
		return nil, fmt.Errorf("apiserver: %w", err)
	}
	s := &Server{
		t:      &standaloneTB{logf: logf},
		opts:   opts,
		dir:    work,
		bins:   b,
		tokens: map[string]string{},
		groups: map[string][]string{},
	}
	if err := s.setup(); err != nil {
		os.RemoveAll(work)
		return nil, fmt.Errorf("apiserver: %w", err)
	}
	for attempt := 0; attempt < 3; attempt++ {
		if err = s.pickPorts(); err != nil {
			break
		}
		if err = s.start(); err == nil {
			return s, nil
		}
		s.kill()
		if !errors.Is(err, errAddrInUse) {
			break
		}
		logf("apiserver: port conflict, retrying: %v", err)
	}
	os.RemoveAll(work)
	return nil, fmt.Errorf("apiserver: %w", err)
}

// Close stops a server made by StartServer and removes its directory.
// (Servers made by Start are cleaned up by the test.)
func (s *Server) Close() {
	s.kill()
	if _, ok := s.t.(*standaloneTB); ok {
		os.RemoveAll(s.dir)
	}
}

// FatalError is the panic value of a Server method that would have failed
// the test, on a server made by StartServer.
type FatalError struct{ Msg string }

func (e *FatalError) Error() string { return e.Msg }

type standaloneTB struct {
	logf   func(string, ...any)
	failed bool
}

func (s *standaloneTB) Helper()                         {}
func (s *standaloneTB) Logf(format string, args ...any) { s.logf(format, args...) }
func (s *standaloneTB) Failed() bool                    { return s.failed }
func (s *standaloneTB) Fatalf(format string, args ...any) {
	s.failed = true
	panic(&FatalError{Msg: fmt.Sprintf(format, args...)})
}
