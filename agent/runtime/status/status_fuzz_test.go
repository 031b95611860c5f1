package status

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// FuzzStatusJSON: `meshlet status --node` and `meshlet diagnose` decode the
// /status an agent answers (through pods/exec: the node's agent, or
// whatever runs in its pod, chooses the bytes) and print it. Decoding
// never panics; whatever decodes prints as text, and encodes to JSON
// that decodes to the same encoding (what an operator gets with -o json
// is what the agent said).
//
//	go test -run='^$' -fuzz='^FuzzStatusJSON$' -parallel=1 ./agent/runtime/status/
func FuzzStatusJSON(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.json")
	if len(files) == 0 {
		f.Fatal("no testdata/*.json")
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"peers":[{}],"routes":[{}],"rejections":[{"reason":"x"}],"leadership":{"roles":[{}]}}`))
	f.Add([]byte(`{"at":"9999-12-31T23:59:59Z","peers":[{"lastHandshake":"0001-01-01T00:00:00Z","receiveBytes":-1}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s Status
		if json.Unmarshal(b, &s) != nil {
			return
		}
		if err := Print(io.Discard, s); err != nil {
			t.Fatalf("printing: %v", err)
		}
		once, err := json.Marshal(s)
		if err != nil {
			return // e.g. a time past year 9999: the agent never sends one
		}
		var s2 Status
		if err := json.Unmarshal(once, &s2); err != nil {
			t.Fatalf("re-decoding %s: %v", once, err)
		}
		twice, err := json.Marshal(s2)
		if err != nil || !bytes.Equal(once, twice) {
			t.Fatalf("JSON round trip:\n %s\n %s\n %v", once, twice, err)
		}
	})
}
