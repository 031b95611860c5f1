package cni

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// FuzzCNIConfList: the configuration list in the CNI directory (the
// install-cni init container writes it, and any root process on the node
// can rewrite it), read and written through a file as the agent does.
// Read refuses with ErrInvalid exactly what Write refuses, and Write then
// leaves the file as it was; Write of the range Read returns changes
// nothing. What Write writes reads back as that range, sets it as the only
// range of every IPAM section, keeps everything else of the list (as JSON
// values), and a second Write changes nothing.
//
//	go test -run='^$' -fuzz='^FuzzCNIConfList$' -parallel=1 ./agent/runtime/cni/
func FuzzCNIConfList(f *testing.F) {
	f.Add([]byte(kiloConflist), "10.2.3.0/24")
	f.Add([]byte(kiloConflist), "fd00:10:2:3::/64")
	f.Add([]byte(`{"plugins":[{"type":"bridge","ipam":{"type":"host-local","ranges":[[{"subnet":"10.2.3.0/24"}]]}}]}`), "10.2.3.0/24")
	f.Add([]byte(`{"plugins":[{"ipam":{"ranges":[[{"subnet":"10.9.0.0/16","gateway":"10.9.0.1"}],[{"subnet":"fd00::/64"}]]}},{"ipam":{}}]}`), "10.2.3.0/24")
	f.Add([]byte(`{"plugins":[{"ipam":{"ranges":"x"}},{"type":"portmap"}],"mtu":1e3}`), "10.2.3.0/24")
	f.Add([]byte(`{"plugins":[{"type":"portmap"}]}`), "10.2.3.0/24")
	f.Add([]byte(`{"plugins":[{"ipam":"host-local"}]}`), "10.2.3.0/24")
	f.Fuzz(func(t *testing.T, content []byte, subnet string) {
		sub, err := netip.ParsePrefix(subnet)
		if err != nil {
			return // the plan's range is a prefix
		}
		path := filepath.Join(t.TempDir(), "10-kilo.conflist")
		if err := os.WriteFile(path, content, 0o644); err != nil {
			t.Fatal(err)
		}
		file := &File{Path: path}
		st, readErr := file.Read()
		changed, writeErr := file.Write(sub)
		after, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if (readErr == nil) != (writeErr == nil) {
			t.Fatalf("Read: %v; Write: %v", readErr, writeErr)
		}
		if readErr != nil {
			if !errors.Is(readErr, ErrInvalid) || !errors.Is(writeErr, ErrInvalid) || changed {
				t.Fatalf("refused without ErrInvalid: Read %v, Write %v, changed %v", readErr, writeErr, changed)
			}
			if !bytes.Equal(after, content) {
				t.Fatalf("a file Write refuses was changed:\n%s", after)
			}
			return
		}
		if changed == (st.Subnet == sub) {
			t.Fatalf("Read %v, Write(%v) reports changed = %v", st.Subnet, sub, changed)
		}
		if !changed {
			if !bytes.Equal(after, content) {
				t.Fatalf("unchanged, but the file was rewritten:\n%s", after)
			}
			return
		}
		if st2, err := file.Read(); err != nil || st2.Subnet != sub {
			t.Fatalf("after Write(%v): Read = %v, %v\n%s", sub, st2.Subnet, err, after)
		}
		var before, written map[string]any
		if err := json.Unmarshal(content, &before); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(after, &written); err != nil {
			t.Fatalf("the written file is no JSON object: %v\n%s", err, after)
		}
		want := []any{[]any{map[string]any{"subnet": sub.String()}}}
		for _, p := range before["plugins"].([]any) {
			if ipam, ok := p.(map[string]any)["ipam"].(map[string]any); ok {
				ipam["ranges"] = want
			}
		}
		if !reflect.DeepEqual(before, written) {
			t.Fatalf("Write(%v) of\n%s\nwrote\n%s", sub, content, after)
		}
		if again, err := file.Write(sub); err != nil || again {
			t.Fatalf("a second Write(%v): changed %v, %v", sub, again, err)
		}
		if last, _ := os.ReadFile(path); !bytes.Equal(last, after) {
			t.Fatalf("a second Write rewrote the file:\n%s", last)
		}
	})
}
