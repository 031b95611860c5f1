package apiserver

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

type binaries struct {
	dir           string
	kubeAPIServer string
	kubectl       string
	etcd          string
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// BinDir returns the directory holding kube-apiserver, kubectl and etcd:
// $MESHLET_K8S_BIN, else the output of hack/k8s/ensure.sh (which builds them
// on first use, 7-12 min cold). The result is computed once per process.
func BinDir() (string, error) {
	binOnce.Do(func() {
		if d := os.Getenv("MESHLET_K8S_BIN"); d != "" {
			binDir = d
			return
		}
		binDir, binErr = runEnsure()
	})
	return binDir, binErr
}

var (
	toolsOnce sync.Once
	toolsDir  string
	toolsErr  error
)

// ToolsDir returns the directory holding staticcheck and kustomize:
// $MESHLET_TOOLS_BIN, else the output of "hack/k8s/ensure.sh tools".
func ToolsDir() (string, error) {
	toolsOnce.Do(func() {
		if d := os.Getenv("MESHLET_TOOLS_BIN"); d != "" {
			toolsDir = d
			return
		}
		toolsDir, toolsErr = runEnsure("tools")
	})
	return toolsDir, toolsErr
}

func runEnsure(args ...string) (string, error) {
	script, err := findEnsureScript()
	if err != nil {
		return "", err
	}
	var stderr bytes.Buffer
	cmd := exec.Command(script, args...)
	// ensure.sh prints progress on stderr; pass it through so a long cold
	// build is visible with go test -v.
	cmd.Stderr = io.MultiWriter(&stderr, os.Stderr)
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %v\n%s", script, strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// Bin returns the path of one of the binaries (kube-apiserver, kubectl, etcd).
func Bin(name string) (string, error) {
	dir, err := BinDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	// etcd may come from Debian's etcd-server package instead.
	if name == "etcd" {
		if p, err := exec.LookPath("etcd"); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in %s", name, dir)
}

// SkipOrFail skips the test with reason, or fails it when CI=true: in CI a
// missing prerequisite is a broken setup, not a reason to pass.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

func findBinaries(t testing.TB) binaries {
	t.Helper()
	var b binaries
	var errs []error
	for _, x := range []struct {
		name string
		dst  *string
	}{{"kube-apiserver", &b.kubeAPIServer}, {"kubectl", &b.kubectl}, {"etcd", &b.etcd}} {
		p, err := Bin(x.name)
		errs = append(errs, err)
		*x.dst = p
	}
	if err := errors.Join(errs...); err != nil {
		SkipOrFail(t, "apiserver: no Kubernetes binaries (set MESHLET_K8S_BIN or run hack/k8s/ensure.sh): %v", err)
	}
	b.dir, _ = BinDir()
	return b
}

// findEnsureScript walks up from the working directory (go test runs in the
// package's directory) to the repository root holding hack/k8s/ensure.sh.
func findEnsureScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, "hack", "k8s", "ensure.sh")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("hack/k8s/ensure.sh not found above the working directory")
		}
		dir = parent
	}
}
