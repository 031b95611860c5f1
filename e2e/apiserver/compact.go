package apiserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
)

// CompactEtcd compacts etcd's history up to its current revision (through
// etcd's JSON gateway, as `etcdctl compact` does): a watch resumed from an
// older resourceVersion then fails with 410 Gone and its client must list
// again. It returns the revision compacted at.
func (s *Server) CompactEtcd(ctx context.Context) (int64, error) {
	base := fmt.Sprintf("http://127.0.0.1:%d/v3/kv/", s.etcdPort)
	post := func(path string, body any, out any) error {
		b, _ := json.Marshal(body)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(b))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return fmt.Errorf("etcd %s: %w", path, err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("etcd %s: %s", path, resp.Status)
		}
		if out != nil {
			return json.NewDecoder(resp.Body).Decode(out)
		}
		return nil
	}
	// The header of any range answer carries the current revision.
	var rng struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	if err := post("range", map[string]any{"key": base64.StdEncoding.EncodeToString([]byte("/registry/")), "limit": 1, "keys_only": true}, &rng); err != nil {
		return 0, err
	}
	rev, err := strconv.ParseInt(rng.Header.Revision, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("etcd revision %q: %w", rng.Header.Revision, err)
	}
	if err := post("compaction", map[string]any{"revision": rev, "physical": true}, nil); err != nil {
		return 0, err
	}
	return rev, nil
}
