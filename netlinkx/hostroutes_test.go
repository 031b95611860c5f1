package netlinkx

import (
	"context"
	"slices"
	"strings"
	"testing"
)

// TestRoutesMeshletDoesNotOwn: on a real namespace with the host's own
// routes in place — two default routes (metric 0 and a DHCP one at 100), the
// connected network of its underlay, a CNI's route — and a route kg left
// through kilo0, a desired route to each destination: kg's is taken over,
// the host's are left exactly as they were and reported as conflicts, the
// others are installed. HostRoutes lists the host's, not kg's nor what runs
// over kilo0.
func TestRoutesMeshletDoesNotOwn(t *testing.T) {
	requireRoot(t)
	ns := newTestNS(t)
	ns.ip(t, "link", "set", "kilo0", "up")
	ns.ip(t, "route", "add", "default", "via", "192.168.50.253", "dev", "ul0", "proto", "dhcp", "metric", "100")
	ns.ip(t, "route", "add", "10.9.0.0/24", "dev", "ul0")                                                     // a CNI's
	ns.ip(t, "route", "add", "10.2.0.0/24", "via", "100.66.0.2", "dev", "kilo0", "onlink", "proto", "static") // kg's
	ns.ip(t, "route", "add", "10.2.1.0/24", "via", "192.168.50.7", "dev", "ul0", "onlink", "proto", "static") // kg's, a non-leader's
	ns.ip(t, "addr", "add", "100.66.0.1/24", "dev", "kilo0")                                                  // the kernel's route on kilo0
	before := ns.ip(t, "route", "show", "table", "main")
	hostOwn := func(out string) []string {
		var keep []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if !strings.Contains(l, "kilo0") && !strings.Contains(l, "proto 109") && !strings.Contains(l, "proto static") {
				keep = append(keep, strings.TrimSpace(l))
			}
		}
		return keep
	}

	got, err := ns.host.HostRoutes("kilo0", 254)
	if err != nil {
		t.Fatal(err)
	}
	var dsts []string
	for _, r := range got {
		dsts = append(dsts, r.Dst.String()+" "+r.Desc)
	}
	want := []string{
		"0.0.0.0/0 default via 192.168.50.254 dev ul0 proto boot",
		"10.9.0.0/24 10.9.0.0/24 dev ul0 proto boot",
		"192.168.50.0/24 192.168.50.0/24 dev ul0 proto kernel",
	}
	if !slices.Equal(dsts, want) {
		t.Errorf("HostRoutes:\n got %q\nwant %q", dsts, want)
	}

	desired := []Route{
		route("0.0.0.0/0", "", "kilo0", "", 0, false),
		route("192.168.50.0/24", "", "kilo0", "", 0, false),
		route("10.9.0.0/24", "", "kilo0", "", 0, false),
		route("10.2.0.0/24", "100.66.0.2", "kilo0", "", 0, true),
		route("10.2.1.0/24", "100.66.0.2", "kilo0", "", 0, true),
		route("10.3.0.0/24", "", "kilo0", "", 0, false),
	}
	rep, err := ns.host.ReconcileRoutes(context.Background(), desired, "kilo0")
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Replaced) != 3 {
		t.Errorf("replaced %q, want kg's two routes and 10.3.0.0/24", rep.Replaced)
	}
	wantConflicts := []string{
		"0.0.0.0/0: default via 192.168.50.254 dev ul0 proto boot",
		"192.168.50.0/24: 192.168.50.0/24 dev ul0 proto kernel",
		"10.9.0.0/24: 10.9.0.0/24 dev ul0 proto boot",
	}
	slices.Sort(rep.Conflicts)
	slices.Sort(wantConflicts)
	if !slices.Equal(rep.Conflicts, wantConflicts) {
		t.Errorf("conflicts:\n got %q\nwant %q", rep.Conflicts, wantConflicts)
	}
	after := ns.ip(t, "route", "show", "table", "main")
	if b, a := hostOwn(before), hostOwn(after); !slices.Equal(a, b) {
		t.Errorf("the host's own routes changed:\nbefore %q\nafter  %q", b, a)
	}
	for _, want := range []string{"10.2.0.0/24 via 100.66.0.2 dev kilo0 proto 109 onlink", "10.2.1.0/24 via 100.66.0.2 dev kilo0 proto 109 onlink", "10.3.0.0/24 dev kilo0 proto 109"} {
		if !strings.Contains(after, want) {
			t.Errorf("missing %q in\n%s", want, after)
		}
	}
	if strings.Contains(after, "proto static") {
		t.Errorf("kg's routes were not taken over:\n%s", after)
	}
	// Applied again: nothing to do, the same conflicts.
	rep, err = ns.host.ReconcileRoutes(context.Background(), desired, "kilo0")
	if err != nil || len(rep.Replaced)+len(rep.Deleted) != 0 || len(rep.Conflicts) != 3 {
		t.Errorf("second reconcile: %+v, %v", rep, err)
	}
	// The host's route gone, meshlet's goes in.
	ns.ip(t, "route", "del", "10.9.0.0/24", "dev", "ul0")
	rep, err = ns.host.ReconcileRoutes(context.Background(), desired, "kilo0")
	if err != nil || len(rep.Replaced) != 1 || len(rep.Conflicts) != 2 {
		t.Errorf("after the CNI's route went: %+v, %v", rep, err)
	}
}
