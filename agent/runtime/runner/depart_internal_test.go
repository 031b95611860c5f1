package runner

import "testing"

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
