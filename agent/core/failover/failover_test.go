package failover

import "testing"

func TestLeaseName(t *testing.T) {
	for loc, want := range map[string]string{
		"x":                "meshlet-leader-x",
		"eu-west-1":        "meshlet-leader-eu-west-1",
		"Frankfurt Rack/2": "meshlet-leader-frankfurt-rack-2-" + LeaseName("Frankfurt Rack/2")[len(LeaseName("Frankfurt Rack/2"))-12:],
	} {
		if got := LeaseName(loc); got != want {
			t.Errorf("LeaseName(%q) = %q, want %q", loc, got, want)
		}
	}
	if LeaseName("a.b") == LeaseName("a-b") {
		t.Error("two locations share a Lease")
	}
}
