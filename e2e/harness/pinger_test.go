package harness

import "testing"

func TestPingReply(t *testing.T) {
	for _, tc := range []struct {
		line string
		seq  string // "" when the line is no reply
	}{
		{"[1764712345.123456] 64 bytes from 10.2.0.5: icmp_seq=7 ttl=62 time=0.512 ms", "7"},
		{"[1764712345.1] 64 bytes from 10.2.0.5: icmp_seq=12 ttl=64 time=1.02 ms (DUP!)", "12"},
		{"[1764712345.123456] From 172.20.0.11 icmp_seq=7 Destination Net Unreachable", ""},
		{"[1764712345.123456] From 172.20.0.11 icmp_seq=8 Destination Host Unreachable", ""},
		{"[1764712345.123456] From 172.20.0.11: icmp_seq=9 Redirect Host(New nexthop: 172.20.0.12)", ""},
		{"PING 10.2.0.5 (10.2.0.5) from 10.1.0.2 : 56(84) bytes of data.", ""},
		{"[1764712345.123456] no answer yet for icmp_seq=3", ""},
	} {
		m := pingReply.FindStringSubmatch(tc.line)
		got := ""
		if m != nil {
			got = m[3]
		}
		if got != tc.seq {
			t.Errorf("%q: seq %q, want %q", tc.line, got, tc.seq)
		}
	}
}
