package main

import (
	"bytes"
	"context"
	"io"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/spf13/cobra"
)

// TestHelpText renders every command's --help as a user gets it (execute,
// as main runs it) and requires each readable: a flag's value name is one
// word (pflag takes a back-quoted word of the usage as the value name, so
// a quoted command line became one), no default that says nothing
// ("(default map[])"), one default per flag (the usage's "default: …" and
// pflag's "(default …)" both), no line wider than helpWidth.
func TestHelpText(t *testing.T) {
	defaultRe := regexp.MustCompile(`(?:\(|; )default[: ]`)
	checks := []struct {
		name string
		// bad returns the offending parts of one flag's entry (its
		// lines joined), or of the whole help when flag is false.
		bad  func(s string) []string
		flag bool
	}{
		{"value name longer than one word", func(s string) []string {
			if v := valueName(s); strings.ContainsAny(v, " \t") {
				return []string{v}
			}
			return nil
		}, true},
		{"a default that says nothing", func(s string) []string {
			for _, empty := range []string{"(default map[])", "(default [])", `(default "")`} {
				if strings.Contains(s, empty) {
					return []string{empty}
				}
			}
			return nil
		}, true},
		{"two defaults", func(s string) []string {
			if m := defaultRe.FindAllString(s, -1); len(m) > 1 {
				return m
			}
			return nil
		}, true},
		{"line wider than 120 columns", func(s string) []string {
			var wide []string
			for l := range strings.Lines(s) {
				if l = strings.TrimRight(l, "\n"); utf8.RuneCountInString(l) > helpWidth {
					wide = append(wide, l)
				}
			}
			return wide
		}, false},
	}
	for _, path := range commandPaths() {
		args := append(path[1:len(path):len(path)], "--help")
		t.Run(strings.Join(path, "_"), func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := execute(context.Background(), args, &out, &errOut); code != 0 {
				t.Fatalf("%s --help: exit status %d: %s", strings.Join(path, " "), code, errOut.String())
			}
			help := out.String()
			entries := flagEntries(help)
			if len(entries) == 0 {
				t.Fatalf("no flags found in:\n%s", help)
			}
			for _, c := range checks {
				parts := []string{help}
				if c.flag {
					parts = entries
				}
				for _, p := range parts {
					if bad := c.bad(p); len(bad) > 0 {
						t.Errorf("%s: %q\n  in: %s", c.name, bad, firstLine(p))
					}
				}
			}
		})
	}
}

// commandPaths is every command of meshlet's tree, hidden ones and
// cobra's own (help, completion) included, each as its path from the
// root ("meshlet", "kg", "version").
func commandPaths() [][]string {
	root := newRoot(io.Discard, io.Discard)
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	var paths [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		paths = append(paths, path)
		for _, sub := range c.Commands() {
			walk(sub, append(path[:len(path):len(path)], sub.Name()))
		}
	}
	walk(root, []string{root.Name()})
	return paths
}

// flagEntries splits the flag sections of a help text into one string per
// flag, its wrapped lines joined with a space.
func flagEntries(help string) []string {
	var entries []string
	in := false
	for l := range strings.Lines(help) {
		l = strings.TrimRight(l, "\n")
		switch {
		case strings.HasSuffix(l, "Flags:") && !strings.HasPrefix(l, " "):
			in = true
		case !in:
		case strings.HasPrefix(l, "  -") || strings.HasPrefix(l, "      --"):
			entries = append(entries, l)
		case strings.HasPrefix(l, "       ") && len(entries) > 0: // a wrapped line
			entries[len(entries)-1] += " " + strings.TrimSpace(l)
		default:
			in = false
		}
	}
	return entries
}

// valueName is what a flag's entry shows after the flag's name and before
// the usage (pflag separates the two by at least two spaces): "" for a
// boolean.
func valueName(entry string) string {
	l := strings.TrimLeft(entry, " ")
	if strings.HasPrefix(l, "-") && !strings.HasPrefix(l, "--") { // "-o, --output"
		_, l, _ = strings.Cut(l, ", ")
	}
	head, _, _ := strings.Cut(l, "  ")
	_, v, _ := strings.Cut(head, " ")
	return v
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
