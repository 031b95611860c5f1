// Package cni is the actuator of the node's CNI configuration where Kilo is
// the CNI (kg's --cni): Kilo's manifests install a configuration list
// (bridge kube-bridge, host-local IPAM without a range, portmap) with an
// init container, and the agent writes the node's pod CIDR into every IPAM
// section of it, as kg does (docs/dropin.md#cni). It reads what is there
// for the planner (Read) and writes only the range the plan asks for
// (Write); a file it cannot parse is left as it is.
package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
)

// MaxSize bounds what is read: a configuration list is a few hundred bytes.
const MaxSize = 1 << 20

// File is one CNI configuration list.
type File struct {
	Path string
}

// State is what the file holds: Subnet is the first IPAM range's subnet
// (zero when there is none yet, as the install-cni init container leaves
// it).
type State struct {
	Subnet netip.Prefix
}

// ErrInvalid wraps every reason the file is not a configuration list
// meshlet can write a range into.
var ErrInvalid = errors.New("not a CNI configuration list with an IPAM section")

// Read parses the file. A missing file is an error: the install-cni init
// container writes it before the agent starts.
func (f *File) Read() (State, error) {
	raw, err := f.load()
	if err != nil {
		return State{}, err
	}
	_, st, err := parse(raw)
	return st, err
}

// Write sets the IPAM range of every plugin that has an IPAM section to
// subnet, and reports whether the file changed. It writes a new file and
// renames it over the old one, so the CNI never reads half a file.
func (f *File) Write(subnet netip.Prefix) (bool, error) {
	raw, err := f.load()
	if err != nil {
		return false, err
	}
	doc, st, err := parse(raw)
	if err != nil {
		return false, err
	}
	if st.Subnet == subnet {
		return false, nil
	}
	for _, p := range doc["plugins"].([]any) {
		if ipam, ok := p.(map[string]any)["ipam"].(map[string]any); ok {
			ipam["ranges"] = []any{[]any{map[string]any{"subnet": subnet.String()}}}
		}
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return false, fmt.Errorf("cni: encoding %s: %w", f.Path, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.Path), ".meshlet-cni-*")
	if err != nil {
		return false, fmt.Errorf("cni: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(append(out, '\n')); err != nil {
		tmp.Close()
		return false, fmt.Errorf("cni: writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return false, fmt.Errorf("cni: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return false, fmt.Errorf("cni: %w", err)
	}
	if err := os.Rename(tmp.Name(), f.Path); err != nil {
		return false, fmt.Errorf("cni: replacing %s: %w", f.Path, err)
	}
	return true, nil
}

func (f *File) load() ([]byte, error) {
	fh, err := os.Open(f.Path)
	if err != nil {
		return nil, fmt.Errorf("cni: %w", err)
	}
	defer fh.Close()
	raw, err := io.ReadAll(io.LimitReader(fh, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("cni: reading %s: %w", f.Path, err)
	}
	if len(raw) > MaxSize {
		return nil, fmt.Errorf("cni: %s: %w: larger than %d bytes", f.Path, ErrInvalid, MaxSize)
	}
	return raw, nil
}

// parse checks the shape Write edits: an object with a list of plugin
// objects, at least one with an IPAM object whose ranges, if any, are
// lists of objects with a subnet.
func parse(raw []byte) (map[string]any, State, error) {
	var st State
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, st, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	plugins, ok := doc["plugins"].([]any)
	if !ok {
		return nil, st, fmt.Errorf("%w: no plugins list", ErrInvalid)
	}
	found := false
	for i, p := range plugins {
		pm, ok := p.(map[string]any)
		if !ok {
			return nil, st, fmt.Errorf("%w: plugin %d is not an object", ErrInvalid, i)
		}
		raw, has := pm["ipam"]
		if !has {
			continue
		}
		ipam, ok := raw.(map[string]any)
		if !ok {
			return nil, st, fmt.Errorf("%w: plugin %d: ipam is not an object", ErrInvalid, i)
		}
		found = true
		sets, _ := ipam["ranges"].([]any)
		for _, set := range sets {
			rs, _ := set.([]any)
			for _, r := range rs {
				rm, _ := r.(map[string]any)
				s, _ := rm["subnet"].(string)
				if p, err := netip.ParsePrefix(s); err == nil && !st.Subnet.IsValid() {
					st.Subnet = p
				}
			}
		}
	}
	if !found {
		return nil, st, fmt.Errorf("%w: no plugin has an ipam section", ErrInvalid)
	}
	return doc, st, nil
}
