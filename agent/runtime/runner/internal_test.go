package runner

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
)

func TestImageRepository(t *testing.T) {
	for in, want := range map[string]string{
		"meshlet":                          "meshlet",
		"ghcr.io/meshlet/meshlet:v1.2.3":   "ghcr.io/meshlet/meshlet",
		"localhost:5000/meshlet:e2e":       "localhost:5000/meshlet",
		"localhost:5000/meshlet":           "localhost:5000/meshlet",
		"squat/kilo@sha256:0123":           "squat/kilo",
		"ghcr.io/x/kilo:0.7.0@sha256:abcd": "ghcr.io/x/kilo",
	} {
		if got := imageRepository(in); got != want {
			t.Errorf("imageRepository(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestListenUnix: the status socket is its owner's only, in a directory
// created 0700; a stale socket is replaced, a live one or a file refused.
func TestListenUnix(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run-meshlet")
	path := filepath.Join(dir, "status.sock")
	ln, err := ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{dir: 0o700, path: 0o600} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, %v; want %v", p, fi.Mode().Perm(), err, want)
		}
	}
	if _, err := ListenUnix(path); !errors.Is(err, ErrStatusSocketTaken) {
		t.Errorf("a live socket was taken over: %v", err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close() // stale now: the file stays, nobody answers
	ln2, err := ListenUnix(path)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	ln2.Close()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ListenUnix(file); err == nil {
		t.Error("a regular file was replaced")
	}
}
