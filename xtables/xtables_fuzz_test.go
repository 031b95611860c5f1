package xtables

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// saveCommands are the programs Detect may run, in the order of the
// fuzz target's arguments.
var saveCommands = []string{
	"xtables-nft-multi iptables-save -t mangle",
	"xtables-nft-multi ip6tables-save -t mangle",
	"xtables-legacy-multi iptables-save",
	"xtables-legacy-multi ip6tables-save",
	"xtables-nft-multi iptables-save",
	"xtables-nft-multi ip6tables-save",
}

// oracleSave reads one iptables-save output line by line: its rules
// ("-A ..." lines) and whether it declares kubelet's hint chain or canary.
func oracleSave(out []byte) (rules int, hint bool) {
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "-A ") {
			rules++
		}
		hint = hint || strings.HasPrefix(l, ":KUBE-IPTABLES-HINT ") || strings.HasPrefix(l, ":KUBE-KUBELET-CANARY ")
	}
	return rules, hint
}

// FuzzIPTablesSave: Detect's reading of iptables-save output (whatever the
// host's tables hold: any root process on the node writes them), six
// outputs as the programs print them, some cut short by a failure (a
// timeout, a kernel without the backend). The backend and the rule counts
// in its reason agree with a count of the lines of each output; it never
// asks the legacy backend for the mangle table alone (which would create
// it in the kernel).
//
//	go test -run='^$' -fuzz='^FuzzIPTablesSave$' -parallel=1 ./xtables/
func FuzzIPTablesSave(f *testing.F) {
	f.Add([]byte(hint), []byte(nil), []byte(rules(50)), []byte(nil), []byte(nil), []byte(nil), uint8(0))
	f.Add([]byte(nil), []byte(nil), []byte(rules(4)), []byte(nil), []byte(rules(4)), []byte(nil), uint8(0))
	f.Add([]byte(nil), []byte(nil), []byte(nil), []byte(rules(2)), []byte(nil), []byte(rules(9)), uint8(0))
	// An output cut short before its last newline, then the next one.
	f.Add([]byte(nil), []byte(nil), []byte("*filter\n-A INPUT -j ACCEPT"), []byte(":KUBE-IPTABLES-HINT - [0:0]\n"), []byte(nil), []byte(nil), uint8(1<<2))
	f.Add([]byte(nil), []byte(nil), []byte("*filter\n-A INPUT -j ACCEPT\nCOMMIT"), []byte("-A INPUT -j DROP\n"), []byte(rules(2)), []byte(nil), uint8(0))
	f.Fuzz(func(t *testing.T, nft4m, nft6m, leg4, leg6, nft4, nft6 []byte, failing uint8) {
		outputs := [][]byte{nft4m, nft6m, leg4, leg6, nft4, nft6}
		run := func(_ context.Context, name string, args ...string) ([]byte, error) {
			cmd := name + " " + strings.Join(args, " ")
			for i, c := range saveCommands {
				if c == cmd {
					if failing&(1<<i) != 0 {
						return outputs[i], errors.New("signal: killed")
					}
					return outputs[i], nil
				}
			}
			t.Fatalf("Detect ran %q", cmd)
			return nil, nil
		}
		got, why := Detect(context.Background(), run)

		var counts [6]int
		var hints [6]bool
		for i, out := range outputs {
			counts[i], hints[i] = oracleSave(out)
		}
		nLeg, nNFT := counts[2]+counts[3], counts[4]+counts[5]
		want, wantWhy := NFT, "no rules in either backend"
		switch {
		case hints[0] || hints[1]:
			want, wantWhy = NFT, "nft mangle table"
		case hints[2] || hints[3]:
			want, wantWhy = Legacy, "legacy mangle table"
		case nLeg > 0 && nLeg >= nNFT:
			want, wantWhy = Legacy, fmt.Sprintf("legacy holds %d rules, nft %d", nLeg, nNFT)
		case nNFT > 0:
			want, wantWhy = NFT, fmt.Sprintf("nft holds %d rules, legacy %d", nNFT, nLeg)
		}
		if got != want || !strings.Contains(why, wantWhy) {
			t.Fatalf("Detect = %s (%s); the line count says %s (%s)", got, why, want, wantWhy)
		}
	})
}
