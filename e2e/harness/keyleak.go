package harness

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// KeyLeaks looks for every node's WireGuard private key — base64, as in
// its key file, and hex, as in the device's UAPI — in everything the run
// wrote: each node's logs and files (but the key file itself and the
// device's sockets), and each API server's directory, etcd's data
// included, so a key that reached an annotation, an Event or a status
// is found too (docs/security.md#private-key). extra are more outputs to
// search (e.g. /status, /metrics or diagnose output a test collected). It
// returns one line per leak: where, and whose key.
func (e *Env) KeyLeaks(extra map[string][]byte) []string {
	type secret struct {
		node  string
		forms [][]byte
	}
	var keys []secret
	nodes := filepath.Join(e.dir, "nodes")
	isKeyFile := func(path string, d fs.DirEntry) bool {
		return d.Name() == "key" && strings.HasPrefix(path, nodes+string(filepath.Separator))
	}
	// Every node's key files: meshlet's, and kg's where a test put one.
	_ = filepath.WalkDir(nodes, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || !isKeyFile(path, d) {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		if k, err := wgtypes.ParseKey(strings.TrimSpace(string(b))); err == nil {
			rel, _ := filepath.Rel(nodes, path)
			node, _, _ := strings.Cut(rel, string(filepath.Separator))
			keys = append(keys, secret{node, [][]byte{[]byte(k.String()), []byte(hex.EncodeToString(k[:]))}})
		}
		return nil
	})
	var leaks []string
	check := func(where string, data []byte) {
		for _, k := range keys {
			for _, f := range k.forms {
				if bytes.Contains(data, f) {
					leaks = append(leaks, fmt.Sprintf("%s holds %s's private key", where, k.node))
				}
			}
		}
	}
	roots := []string{e.dir}
	for _, c := range e.Clusters() {
		roots = append(roots, c.Server.Dir())
	}
	for _, root := range roots {
		_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			if isKeyFile(path, d) {
				return nil
			}
			if data, err := os.ReadFile(path); err == nil {
				check(path, data)
			}
			return nil
		})
	}
	for where, data := range extra {
		check(where, data)
	}
	return leaks
}
