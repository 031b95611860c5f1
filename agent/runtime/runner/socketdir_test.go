package runner

import (
	"os"
	"path/filepath"
	"testing"
)

// TestListenUnixOwnsItsDirectory: the status socket's directory ends up
// 0700 whatever mode it had when it is the socket's own (an emptyDir,
// which kubelet creates 0777, holding nothing or a stale socket), and is
// left as it is when it is shared (another file in it), not this user's,
// or a symlink. The socket is 0600 either way.
func TestListenUnixOwnsItsDirectory(t *testing.T) {
	const sock = "status.sock"
	for _, tc := range []struct {
		name string
		// setup makes the socket's directory in tmp and returns it.
		setup func(t *testing.T, tmp string) string
		want  os.FileMode
	}{
		{name: "an empty 0777 directory (kubelet's emptyDir)", want: 0o700,
			setup: func(t *testing.T, tmp string) string { return mkdir(t, filepath.Join(tmp, "run-meshlet"), 0o777) }},
		{name: "a 0777 directory with a stale socket of this name", want: 0o700,
			setup: func(t *testing.T, tmp string) string {
				dir := mkdir(t, filepath.Join(tmp, "run-meshlet"), 0o777)
				ln, err := ListenUnix(filepath.Join(dir, sock))
				if err != nil {
					t.Fatal(err)
				}
				ln.(interface{ SetUnlinkOnClose(bool) }).SetUnlinkOnClose(false)
				_ = ln.Close()
				return mkdir(t, dir, 0o777)
			}},
		{name: "a 0750 directory of its own", want: 0o700,
			setup: func(t *testing.T, tmp string) string { return mkdir(t, filepath.Join(tmp, "run-meshlet"), 0o750) }},
		{name: "a shared 0777 directory (another file in it): left", want: 0o777,
			setup: func(t *testing.T, tmp string) string {
				dir := mkdir(t, filepath.Join(tmp, "run"), 0o777)
				if err := os.WriteFile(filepath.Join(dir, "other.pid"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
				return dir
			}},
		{name: "another user's 0777 directory: left", want: 0o777,
			setup: func(t *testing.T, tmp string) string {
				if os.Geteuid() != 0 {
					t.Skip("chown needs root")
				}
				dir := mkdir(t, filepath.Join(tmp, "theirs"), 0o777)
				if err := os.Chown(dir, 65534, 65534); err != nil {
					t.Fatal(err)
				}
				return dir
			}},
		{name: "a symlink to a 0777 directory: left", want: 0o777,
			setup: func(t *testing.T, tmp string) string {
				mkdir(t, filepath.Join(tmp, "target"), 0o777)
				link := filepath.Join(tmp, "link")
				if err := os.Symlink(filepath.Join(tmp, "target"), link); err != nil {
					t.Fatal(err)
				}
				return link
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.setup(t, t.TempDir())
			path := filepath.Join(dir, sock)
			ln, err := ListenUnix(path)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			fi, err := os.Stat(dir) // through a symlink: its target
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Mode().Perm(); got != tc.want {
				t.Errorf("directory mode %v, want %v", got, tc.want)
			}
			if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("socket: %v, %v; want mode 0600", fi, err)
			}
		})
	}
}

// mkdir makes dir (if missing) with exactly mode, whatever the umask.
func mkdir(t *testing.T, dir string, mode os.FileMode) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	return dir
}
