package wg

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// DefaultKeyPath is where the node's private key lives on the host.
const DefaultKeyPath = "/var/lib/meshlet/key"

// LoadOrCreateKey returns the private key stored at path, generating and
// storing a new one (mode 0600) when the file does not exist. The key is
// generated once and reused across restarts so the node's public key, which
// other nodes and clusters have pinned, stays stable. Neither the key nor the
// file content ever appears in an error or log message.
func LoadOrCreateKey(path string) (key wgtypes.Key, created bool, err error) {
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		k, perr := wgtypes.ParseKey(strings.TrimSpace(string(b)))
		if perr != nil {
			// Do not wrap perr: some decoders quote the input.
			return wgtypes.Key{}, false, fmt.Errorf("private key file %s: not a base64 WireGuard key", path)
		}
		// A key readable by others is a leak waiting to happen; tighten it
		// rather than refuse to start.
		if fi, serr := os.Stat(path); serr == nil && fi.Mode().Perm()&0o077 != 0 {
			if cerr := os.Chmod(path, 0o600); cerr != nil {
				return wgtypes.Key{}, false, fmt.Errorf("restrict private key file %s to 0600: %w", path, cerr)
			}
		}
		if err := restrictDir(filepath.Dir(path)); err != nil {
			return wgtypes.Key{}, false, err
		}
		return k, false, nil
	case !errors.Is(err, fs.ErrNotExist):
		return wgtypes.Key{}, false, fmt.Errorf("read private key file %s: %w", path, err)
	}

	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return wgtypes.Key{}, false, fmt.Errorf("generate private key: %w", err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return wgtypes.Key{}, false, fmt.Errorf("create key directory %s: %w", dir, err)
	}
	if err := restrictDir(dir); err != nil {
		return wgtypes.Key{}, false, err
	}
	// Write to a temporary file and rename, so a crash never leaves a
	// truncated key behind that would be "reused" as garbage.
	f, err := os.CreateTemp(dir, ".key-*")
	if err != nil {
		return wgtypes.Key{}, false, fmt.Errorf("create private key file in %s: %w", dir, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return wgtypes.Key{}, false, fmt.Errorf("chmod private key file: %w", err)
	}
	if _, err := f.WriteString(k.String() + "\n"); err != nil {
		f.Close()
		return wgtypes.Key{}, false, fmt.Errorf("write private key file: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return wgtypes.Key{}, false, fmt.Errorf("sync private key file: %w", err)
	}
	if err := f.Close(); err != nil {
		return wgtypes.Key{}, false, fmt.Errorf("close private key file: %w", err)
	}
	// Link instead of rename: if another process created the key meanwhile,
	// keep theirs rather than silently replacing the node's identity.
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return LoadOrCreateKey(path)
		}
		return wgtypes.Key{}, false, fmt.Errorf("store private key file %s: %w", path, err)
	}
	return k, true, nil
}

// restrictDir makes the key's directory 0700 (kg's /var/lib/kilo is
// created 0755): nobody else may list, create or replace files next to
// the key.
func restrictDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("key directory %s: %w", dir, err)
	}
	if fi.Mode().Perm()&0o077 == 0 {
		return nil
	}
	if err := os.Chmod(dir, fi.Mode().Perm()&0o700|0o700); err != nil {
		return fmt.Errorf("restrict key directory %s to 0700: %w", dir, err)
	}
	return nil
}
