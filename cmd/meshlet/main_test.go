package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

// runCmd runs a meshlet command line as main does, printing to out.
func runCmd(args []string, out io.Writer) error {
	root := newRoot(out, io.Discard)
	root.SetArgs(args)
	return root.ExecuteContext(context.Background())
}

// TestCommandLine: kg's conventions — --help exits 0, a wrong command line
// is one error line and exit status 2, a failure at run time exit status 1.
func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string // substring
		stderr string // the whole error output ("" = none)
	}{
		{"run help", []string{"run", "--help"}, 0, "--interface string", ""},
		{"plan help", []string{"plan", "-h"}, 0, "--node string", ""},
		{"cleanup help", []string{"cleanup", "--help"}, 0, "Usage:", ""},
		{"version", []string{"version"}, 0, "meshlet dev\n  commit:   ", ""},
		{"version --short", []string{"version", "--short"}, 0, "dev\n", ""},
		{"--version", []string{"--version"}, 0, "meshlet dev\n", ""},
		{"version -o json", []string{"version", "-o", "json"}, 0, `"version": "dev"`, ""},
		{"version -o bad", []string{"version", "-o", "yaml"}, 2, "", "meshlet version: --output: \"yaml\" must be text or json\n"},
		{"unknown flag", []string{"run", "--bogus"}, 2, "", "meshlet run: unknown flag: --bogus (see 'meshlet run --help')\n"},
		{"single-dash long flag", []string{"run", "-interface=kilo0"}, 2, "", "meshlet run: unknown shorthand flag: 'i' in -interface=kilo0 (see 'meshlet run --help')\n"},
		{"unknown command", []string{"bogus"}, 2, "", "meshlet: unknown command \"bogus\" for \"meshlet\"\n"},
		{"stray argument", []string{"plan", "x"}, 2, "", "meshlet plan: unexpected argument \"x\" (see 'meshlet plan --help')\n"},
		{"bad flag value", []string{"run", "--mesh-granularity=nope", "--hostname=n"}, 2, "", "meshlet run: invalid flags: --mesh-granularity: \"nope\" must be location, full or cross\n"},
		{"missing file", []string{"plan", "--node", "a", "--local", "/nonexistent.yaml"}, 1, "", ""},
		{"status without an agent", []string{"status", "--address", "127.0.0.1:1"}, 1, "", ""},
		{"completion", []string{"completion", "bash"}, 0, "bash completion", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := execute(context.Background(), tc.args, &out, &errOut)
			if code != tc.code {
				t.Errorf("exit status %d, want %d (stderr %q)", code, tc.code, errOut.String())
			}
			if !strings.Contains(out.String(), tc.stdout) {
				t.Errorf("stdout lacks %q:\n%s", tc.stdout, out.String())
			}
			if tc.stderr != "" && errOut.String() != tc.stderr {
				t.Errorf("stderr = %q, want %q", errOut.String(), tc.stderr)
			}
			if tc.code != 0 && strings.Count(errOut.String(), "\n") != 1 {
				t.Errorf("want exactly one error line, got %q", errOut.String())
			}
		})
	}
}

// TestVersionStamped: what the build's -X main.version/commit/date give,
// whole (the release notes and bug reports quote it).
func TestVersionStamped(t *testing.T) {
	saved := [3]string{version, commit, date}
	t.Cleanup(func() { version, commit, date = saved[0], saved[1], saved[2] })
	version, commit, date = "v0.1.0-rc.1", "86436011d983d1c5eaf6c6b397f5e6c3b66f431e", "2026-12-01T15:24:27Z"
	var out bytes.Buffer
	if err := runCmd([]string{"version"}, &out); err != nil {
		t.Fatal(err)
	}
	b := currentBuild()
	want := "meshlet v0.1.0-rc.1\n" +
		"  commit:   86436011d983d1c5eaf6c6b397f5e6c3b66f431e\n" +
		"  built:    2026-12-01T15:24:27Z\n" +
		"  go:       " + b.GoVersion + " " + b.Platform + "\n"
	if out.String() != want {
		t.Errorf("meshlet version:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	if err := runCmd([]string{"version", "--short"}, &out); err != nil || out.String() != "v0.1.0-rc.1\n" {
		t.Errorf("meshlet version --short = %q, %v", out.String(), err)
	}
}
