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
		{"version", []string{"version"}, 0, "meshlet dev", ""},
		{"unknown flag", []string{"run", "--bogus"}, 2, "", "meshlet run: unknown flag: --bogus (see 'meshlet run --help')\n"},
		{"single-dash long flag", []string{"run", "-interface=kilo0"}, 2, "", "meshlet run: unknown shorthand flag: 'i' in -interface=kilo0 (see 'meshlet run --help')\n"},
		{"unknown command", []string{"bogus"}, 2, "", "meshlet: unknown command \"bogus\" for \"meshlet\"\n"},
		{"stray argument", []string{"plan", "x"}, 2, "", "meshlet plan: unexpected argument \"x\" (see 'meshlet plan --help')\n"},
		{"bad flag value", []string{"run", "--mesh-granularity=nope", "--hostname=n"}, 2, "", "meshlet run: invalid flags: --mesh-granularity: \"nope\" must be location, full or cross\n"},
		{"missing file", []string{"plan", "--node", "a", "--local", "/nonexistent.yaml"}, 1, "", ""},
		{"status without an agent", []string{"status", "--socket", "/nonexistent/status.sock"}, 1, "", ""},
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
