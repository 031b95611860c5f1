package netlinkx

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Fuzz targets for the parsers of `iptables -S` output (parseChainList,
// splitRule, isKiloRule): what iptables prints of the host's chains, which
// any root process on the node writes. Their seed corpus (testdata/fuzz/,
// real output of iptables-nft and iptables-legacy 1.8.9 in a throwaway
// network namespace) runs in plain `go test`; explore further with (one at
// a time)
//
//	go test -run='^$' -fuzz='^FuzzChainList$' -parallel=1 ./netlinkx/
//
// (docs/security.md#fuzzing has each target's command and figures).

// saveString quotes one argument as iptables prints it (xtables_save_string
// in iptables 1.8: bare when only [A-Za-z0-9_-], else in double quotes
// with ", \ and ' escaped by a backslash).
func saveString(arg string) string {
	bare := arg != ""
	for i := 0; i < len(arg) && bare; i++ {
		c := arg[i]
		bare = c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
	}
	if bare {
		return arg
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(arg); i++ {
		if c := arg[i]; c == '"' || c == '\\' || c == '\'' {
			b.WriteByte('\\')
		}
		b.WriteByte(arg[i])
	}
	b.WriteByte('"')
	return b.String()
}

// ruleLine is the line iptables -S prints for a rule of chain with args.
func ruleLine(chain string, args []string) string {
	var b strings.Builder
	b.WriteString("-A " + chain)
	for _, a := range args {
		b.WriteString(" " + saveString(a))
	}
	return b.String()
}

// listLines is what go-iptables' List returns for output: its lines, the
// newline at the end dropped.
func listLines(output string) []string {
	lines := strings.Split(output, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// The oracle of splitRule: a rule is arguments separated by spaces; an
// argument is bare characters and quoted pieces, in which a backslash
// escapes the next character.
var (
	ruleGrammar = regexp.MustCompile(`^(?: |(?:"(?:\\[\s\S]|[^"\\])*"|[^ "])+)*$`)
	ruleArg     = regexp.MustCompile(`(?:"(?:\\[\s\S]|[^"\\])*"|[^ "])+`)
	argPiece    = regexp.MustCompile(`"((?:\\[\s\S]|[^"\\])*)"|[^"]+`)
	escaped     = regexp.MustCompile(`\\([\s\S])`)
)

func oracleSplit(s string) ([]string, bool) {
	if !ruleGrammar.MatchString(s) {
		return nil, false
	}
	var args []string
	for _, tok := range ruleArg.FindAllString(s, -1) {
		var arg strings.Builder
		for _, m := range argPiece.FindAllStringSubmatchIndex(tok, -1) {
			if m[2] < 0 {
				arg.WriteString(tok[m[0]:m[1]])
				continue
			}
			arg.WriteString(escaped.ReplaceAllString(tok[m[2]:m[3]], "$1"))
		}
		args = append(args, arg.String())
	}
	return args, true
}

// oracleChainList reads iptables -S output as one text: a record ends at
// a newline outside quotes; a record "-A CHAIN" alone, or followed by a
// space and the rule, is a rule of CHAIN.
func oracleChainList(lines []string, chain string) []string {
	text := strings.Join(lines, "\n")
	var records []string
	start, inQuote := 0, false
	for i := 0; i < len(text); i++ {
		switch {
		case text[i] == '\\' && inQuote && i+1 < len(text):
			i++
		case text[i] == '"':
			inQuote = !inQuote
		case text[i] == '\n' && !inQuote:
			records = append(records, text[start:i])
			start = i + 1
		}
	}
	if len(lines) > 0 {
		records = append(records, text[start:])
	}
	var out []string
	for _, r := range records {
		rest, ok := strings.CutPrefix(r, "-A ")
		if !ok {
			continue
		}
		name, spec, _ := strings.Cut(rest, " ")
		if name == chain {
			out = append(out, strings.TrimSpace(spec))
		}
	}
	return out
}

// validChainName: what iptables 1.8 accepts as a chain name (its -N
// refuses an empty name, 29 bytes or more, whitespace, a leading - or !).
func validChainName(s string) bool {
	return s != "" && len(s) < 29 && !strings.ContainsAny(s, " \t\n\v\f\r") && s[0] != '-' && s[0] != '!'
}

// FuzzChainList: the rules parseChainList finds in iptables -S output of
// a chain (as go-iptables' List returns it) are the oracle's, in order;
// every rule that splits, printed back as iptables prints it, lists and
// splits to the same arguments (newlines inside quoted arguments included).
func FuzzChainList(f *testing.F) {
	f.Add("-N MESHLET-NAT\n-A MESHLET-NAT -d 10.4.0.0/16 -j RETURN\n-A MESHLET-NAT -j MASQUERADE\n", "MESHLET-NAT")
	f.Add("-P POSTROUTING ACCEPT\n-A POSTROUTING -s 10.2.0.0/24 -j MESHLET-NAT\n", "POSTROUTING")
	f.Add("-N T\n-A T\n-A T -j RETURN\n", "T")
	f.Add("-P POSTROUTING ACCEPT\n-A POSTROUTING -m comment --comment \"x\n-A POSTROUTING -j KILO-NAT\" -j ACCEPT\n", "POSTROUTING")
	f.Add("-A FORWARD -m comment --comment \"a \\\"q\\\" \\\\ b\\'c\" -j ACCEPT\n", "FORWARD")
	f.Fuzz(func(t *testing.T, output, chain string) {
		if !validChainName(chain) {
			return
		}
		lines := listLines(output)
		got := parseChainList(lines, chain)
		if want := oracleChainList(lines, chain); !slices.Equal(got, want) {
			t.Fatalf("parseChainList(%q, %q)\n = %q\n oracle %q", lines, chain, got, want)
		}
		var printed []string
		var want [][]string
		for _, r := range got {
			args, err := splitRule(r)
			if err != nil {
				continue
			}
			printed = append(printed, ruleLine(chain, args))
			want = append(want, args)
		}
		again := parseChainList(listLines(strings.Join(printed, "\n")+"\n"), chain)
		if len(again) != len(want) {
			t.Fatalf("%d rules printed as\n%q\nlist as %d: %q", len(want), printed, len(again), again)
		}
		for i, r := range again {
			args, err := splitRule(r)
			if err != nil || !slices.Equal(args, want[i]) {
				t.Fatalf("rule %d %q printed as %q lists as %q: %q, %v", i, want[i], printed[i], r, args, err)
			}
		}
	})
}

// FuzzSplitRule: splitRule agrees with the oracle (oracleSplit) on what it
// refuses and on the arguments; the arguments, quoted as iptables prints
// them, split to the same; isKiloRule finds a jump only where the rule
// names a KILO- chain.
func FuzzSplitRule(f *testing.F) {
	for _, rule := range []string{
		`-s 10.244.1.0/24 -m comment --comment "Kilo: jump to KILO-NAT chain" -j KILO-NAT`,
		`-m comment --comment "a \"quoted\" word" -j ACCEPT`,
		`-m comment --comment "" -j RETURN`,
		`-p ipencap -j KILO-IPIP`,
		`--comment "open`,
		`-m comment --comment "a \"q\" \\ b\'c" -j ACCEPT`,
		`-g KILO-x`, `--goto  KILO-`, `a"b c"d`, `"\`,
	} {
		f.Add(rule)
	}
	f.Fuzz(func(t *testing.T, s string) {
		args, err := splitRule(s)
		want, ok := oracleSplit(s)
		if (err == nil) != ok {
			t.Fatalf("splitRule(%q) error %v, oracle accepts: %v", s, err, ok)
		}
		if err != nil {
			if args != nil {
				t.Fatalf("splitRule(%q) = %q with error %v", s, args, err)
			}
			return
		}
		if !slices.Equal(args, want) {
			t.Fatalf("splitRule(%q)\n = %q\n oracle %q", s, args, want)
		}
		line := strings.TrimPrefix(ruleLine("C", args), "-A C")
		again, err := splitRule(line)
		if err != nil || !slices.Equal(again, args) {
			t.Fatalf("%q quoted as iptables does: %q splits to %q, %v", args, line, again, err)
		}
		if isKiloRule(args) && !strings.Contains(s, kiloChainPrefix) {
			t.Fatalf("isKiloRule(%q) without a KILO- chain", args)
		}
		i := slices.IndexFunc(args, func(a string) bool { return strings.HasPrefix(a, kiloChainPrefix) })
		if i > 0 && slices.Contains([]string{"-j", "-g", "--jump", "--goto"}, args[i-1]) && !isKiloRule(args) {
			t.Fatalf("isKiloRule(%q) = false: %s %s", args, args[i-1], args[i])
		}
	})
}

// TestParseChainList holds the cases the fuzz targets' oracle found
// (each fails on the parser before it: the bare rule was skipped, the
// continuation line read as a rule of its own).
func TestParseChainList(t *testing.T) {
	for _, tc := range []struct {
		name, output, chain string
		want                []string
	}{
		{"meshlet's chain", "-N MESHLET-NAT\n-A MESHLET-NAT -d 10.4.0.0/16 -j RETURN\n-A MESHLET-NAT -j MASQUERADE\n", "MESHLET-NAT",
			[]string{"-d 10.4.0.0/16 -j RETURN", "-j MASQUERADE"}},
		{"another chain's rules", "-A MESHLET-NATX -j RETURN\n-A POSTROUTING -j MESHLET-NAT\n", "MESHLET-NAT", nil},
		// iptables -A T with no match and no target: the rule exists, and
		// the rules after it are at positions one further.
		{"a rule with neither match nor target", "-N T\n-A T\n-A T -j RETURN\n", "T", []string{"", "-j RETURN"}},
		// iptables -A POSTROUTING -m comment --comment $'x\n-A POSTROUTING -j KILO-NAT' -j ACCEPT
		{"a newline in a comment", "-P POSTROUTING ACCEPT\n-A POSTROUTING -m comment --comment \"x\n-A POSTROUTING -j KILO-NAT\" -j ACCEPT\n-A POSTROUTING -j KUBE-POSTROUTING\n", "POSTROUTING",
			[]string{"-m comment --comment \"x\n-A POSTROUTING -j KILO-NAT\" -j ACCEPT", "-j KUBE-POSTROUTING"}},
		{"an escaped quote does not close", "-A T -m comment --comment \"a\\\"\n-A T -j KILO-NAT\" -j ACCEPT\n", "T",
			[]string{"-m comment --comment \"a\\\"\n-A T -j KILO-NAT\" -j ACCEPT"}},
		{"a quote left open at the end", "-A T -m comment --comment \"a\n", "T", []string{"-m comment --comment \"a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := parseChainList(listLines(tc.output), tc.chain)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("parseChainList = %q, want %q", got, tc.want)
			}
			for _, r := range got {
				if args, err := splitRule(r); err == nil && isKiloRule(args) {
					t.Errorf("%q read as a jump to a KILO- chain", r)
				}
			}
		})
	}
	// The bare rule's position is deleted, not the rule after it.
	ops := planChain(parseChainList([]string{"-A T", "-A T -j RETURN"}, "T"), []string{"-j RETURN"})
	if len(ops) != 1 || ops[0].insert || ops[0].pos != 1 || ops[0].rule != "" {
		t.Fatalf("planChain = %+v, want the delete of rule 1, the bare one", ops)
	}
}

// TestCleanupKiloAfterOddRules: real iptables (root, a network namespace)
// holding what any root process may write next to kg's leftovers — a
// comment with a newline that reads as a jump to KILO-NAT, a rule with
// neither match nor target in meshlet's chain. CleanupKilo removes kg's
// jump and chain and keeps the others (before parseChainList read the
// newline, it failed on "unterminated quote" and removed nothing of the
// nat table); EnsureFirewall deletes the bare rule, and only it.
func TestCleanupKiloAfterOddRules(t *testing.T) {
	requireRoot(t)
	ns := newTestNS(t)
	ctx := context.Background()
	const multiline = "two\n-A POSTROUTING -j KILO-NAT"
	fw := Firewall{NAT: NAT{Sources: pfx("10.2.0.0/24"), Exceptions: pfx("10.4.0.0/16")}}
	if _, err := ns.host.EnsureFirewall(ctx, fw); err != nil {
		t.Fatal(err)
	}
	for _, r := range [][]string{
		{"-t", "nat", "-N", "KILO-NAT"},
		{"-t", "nat", "-A", "POSTROUTING", "-m", "comment", "--comment", multiline, "-j", "ACCEPT"},
		{"-t", "nat", "-A", "POSTROUTING", "-s", "10.244.1.0/24", "-m", "comment", "--comment", "Kilo: jump to KILO-NAT chain", "-j", "KILO-NAT"},
		{"-t", "nat", "-I", ChainNAT, "1"},
	} {
		ns.exec(t, append([]string{"iptables", "-w"}, r...)...)
	}
	rep, err := ns.host.CleanupKilo(ctx)
	if err != nil {
		t.Fatalf("CleanupKilo: %v", err)
	}
	if want := []string{"IPv4 nat POSTROUTING: -s 10.244.1.0/24 -m comment --comment \"Kilo: jump to KILO-NAT chain\" -j KILO-NAT", "IPv4 nat chain KILO-NAT"}; !slices.Equal(rep.Removed, want) {
		t.Errorf("removed %q, want %q", rep.Removed, want)
	}
	frep, err := ns.host.EnsureFirewall(ctx, fw)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"IPv4 MESHLET-NAT: delete 1 \"\""}; !slices.Equal(frep.Changes, want) {
		t.Errorf("EnsureFirewall changed %q, want %q", frep.Changes, want)
	}
	nat := ns.exec(t, "iptables", "-w", "-t", "nat", "-S")
	for _, keep := range []string{"--comment \"two\n-A POSTROUTING -j KILO-NAT\" -j ACCEPT", "-A MESHLET-NAT -d 10.4.0.0/16 -j RETURN\n-A MESHLET-NAT -j MASQUERADE\n"} {
		if !strings.Contains(nat, keep) {
			t.Errorf("lost %q:\n%s", keep, nat)
		}
	}
	if strings.Contains(nat, "KILO-NAT\n") || strings.Contains(nat, "-A MESHLET-NAT\n") {
		t.Errorf("kg's chain or the bare rule left:\n%s", nat)
	}
}
