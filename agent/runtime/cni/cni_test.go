package cni

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// kiloConflist is what Kilo's install-cni init container writes (its
// ConfigMap kilo, key cni-conf.json): an IPAM section without a range.
const kiloConflist = `{
  "cniVersion":"0.4.0",
  "name":"kilo",
  "plugins":[
    {
      "name":"kubernetes",
      "type":"bridge",
      "bridge":"kube-bridge",
      "isDefaultGateway":true,
      "forceAddress":true,
      "mtu": 1420,
      "ipam":{
        "type":"host-local"
      }
    },
    {
      "type":"portmap",
      "snat":true,
      "capabilities":{"portMappings":true}
    }
  ]
}`

func TestReadWrite(t *testing.T) {
	subnet := netip.MustParsePrefix("10.2.3.0/24")
	for _, tc := range []struct {
		name     string
		content  string // "" = no file
		wantRead netip.Prefix
		wantErr  error // of Read and Write
		changed  bool
	}{
		{name: "Kilo's conflist, no range yet", content: kiloConflist, changed: true},
		{name: "the range already set", content: strings.Replace(kiloConflist, `"type":"host-local"`,
			`"type":"host-local","ranges":[[{"subnet":"10.2.3.0/24"}]]`, 1), wantRead: subnet},
		{name: "another range: rewritten", content: strings.Replace(kiloConflist, `"type":"host-local"`,
			`"type":"host-local","ranges":[[{"subnet":"10.9.9.0/24"}]]`, 1), wantRead: netip.MustParsePrefix("10.9.9.0/24"), changed: true},
		{name: "not JSON", content: "{nope", wantErr: ErrInvalid},
		{name: "no plugins", content: `{"name":"kilo"}`, wantErr: ErrInvalid},
		{name: "no ipam anywhere", content: `{"plugins":[{"type":"portmap"}]}`, wantErr: ErrInvalid},
		{name: "ipam not an object", content: `{"plugins":[{"type":"bridge","ipam":"host-local"}]}`, wantErr: ErrInvalid},
		{name: "missing file", wantErr: os.ErrNotExist},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "10-kilo.conflist")
			if tc.content != "" {
				if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			f := &File{Path: path}
			st, err := f.Read()
			if !errors.Is(err, tc.wantErr) || st.Subnet != tc.wantRead {
				t.Fatalf("Read = %+v, %v; want %v, %v", st, err, tc.wantRead, tc.wantErr)
			}
			changed, err := f.Write(subnet)
			if !errors.Is(err, tc.wantErr) || changed != tc.changed {
				t.Fatalf("Write = %v, %v; want %v, %v", changed, err, tc.changed, tc.wantErr)
			}
			after, _ := os.ReadFile(path)
			if tc.wantErr != nil {
				if string(after) != tc.content {
					t.Fatalf("a file meshlet cannot write was changed:\n%s", after)
				}
				return
			}
			if st, err := f.Read(); err != nil || st.Subnet != subnet {
				t.Fatalf("after Write: %+v, %v", st, err)
			}
			if !tc.changed {
				if string(after) != tc.content {
					t.Fatalf("rewritten without a change:\n%s", after)
				}
				return
			}
			// Everything else of the file is kept.
			for _, keep := range []string{`"bridge": "kube-bridge"`, `"snat": true`, `"mtu": 1420`} {
				if !strings.Contains(string(after), keep) {
					t.Errorf("lost %s:\n%s", keep, after)
				}
			}
			if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o644 {
				t.Errorf("mode %v, want 0644", fi.Mode())
			}
		})
	}
}
