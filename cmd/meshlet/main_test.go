package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/spf13/pflag"
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
		{"--version", []string{"--version"}, 0, "dev\n", ""},
		{"version -o json", []string{"version", "-o", "json"}, 0, `"version": "dev"`, ""},
		{"version -o bad", []string{"version", "-o", "yaml"}, 2, "", "meshlet version: --output: \"yaml\" must be text or json\n"},
		// One wording for every command's --output.
		{"status -o bad", []string{"status", "-o", "yaml"}, 2, "", "meshlet status: --output: \"yaml\" must be text or json\n"},
		{"diagnose -o bad", []string{"diagnose", "-o", "yaml"}, 2, "", "meshlet diagnose: --output: \"yaml\" must be text or json\n"},
		{"plan -o bad", []string{"plan", "--node", "a", "--local", "x", "-o", "dot"}, 2, "", "meshlet plan: --output: \"dot\" must be text, json or yaml\n"},
		{"unknown flag", []string{"run", "--bogus"}, 2, "", "meshlet run: unknown flag: --bogus (see 'meshlet run --help')\n"},
		{"single-dash long flag", []string{"run", "-interface=kilo0"}, 2, "", "meshlet run: unknown shorthand flag: 'i' in -interface=kilo0 (see 'meshlet run --help')\n"},
		{"unknown command", []string{"bogus"}, 2, "", "meshlet: unknown command \"bogus\" for \"meshlet\"\n"},
		{"stray argument", []string{"plan", "x"}, 2, "", "meshlet plan: unexpected argument \"x\" (see 'meshlet plan --help')\n"},
		{"bad flag value", []string{"run", "--mesh-granularity=nope", "--hostname=n"}, 2, "", "meshlet run: invalid flags: --mesh-granularity: \"nope\" must be location, full or cross\n"},
		{"missing file", []string{"plan", "--node", "a", "--local", "/nonexistent.yaml"}, 1, "", ""},
		{"status without an agent", []string{"status", "--socket", "/nonexistent/status.sock"}, 1, "", ""},
		{"completion", []string{"completion", "bash"}, 0, "bash completion", ""},
		// kg's command line: flags without a command are kg's (the image in
		// Kilo's DaemonSet), with kg's defaults.
		{"kg help", []string{"kg", "--help"}, 0, "NAT for the pod subnet) (default true)", ""},
		{"kg's version flag", []string{"--version"}, 0, "dev", ""},
		{"kg's version command", []string{"kg", "version"}, 0, "meshlet dev", ""},
		// The error line names what the user typed ("meshlet", not
		// "meshlet kg"), and a wrong flag says whose flags these are.
		{"kg flags without a command", []string{"--backend=etcd", "--hostname=n"}, 2, "", "meshlet: invalid flags: --backend: \"etcd\": meshlet has only kg's kubernetes backend\n"},
		{"kg's log levels", []string{"--log-level=verbose"}, 2, "", "meshlet: invalid flags: --log-level: \"verbose\" must be all, debug, info, warn, error or none\n"},
		{"unknown flag without a command", []string{"--bogus"}, 2, "", "meshlet: unknown flag: --bogus (flags without a command are kg's: see 'meshlet kg --help')\n"},
		{"unknown flag of kg", []string{"kg", "--bogus"}, 2, "", "meshlet kg: unknown flag: --bogus (see 'meshlet kg --help')\n"},
		{"kg's flag on meshlet run", []string{"run", "--clean-up-interface", "--hostname=n"}, 2, "", "meshlet run: invalid flags: --clean-up-interface: needs --clean-up (as kg: the interface goes with the rest)\n"},
		{"a missing kubeconfig fails before the host is touched", []string{"--kubeconfig=/nonexistent", "--hostname=n"}, 1, "", ""},
		{"webhook needs its certificate", []string{"webhook"}, 2, "", "meshlet webhook: --cert-file and --key-file are required (the webhook serves HTTPS)\n"},
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

// TestKgDefaults: the kg command's defaults are kg 0.7's where they differ
// from meshlet run's, and every kg flag exists on both.
func TestKgDefaults(t *testing.T) {
	kgFlags := []string{"backend", "clean-up", "clean-up-interface", "cni", "cni-path", "compatibility", "create-interface",
		"encapsulate", "hostname", "interface", "internal-cidr", "iptables-forward-rules", "kubeconfig", "listen", "local",
		"log-level", "master", "mesh-granularity", "mtu", "port", "prioritise-private-addresses", "resync-period",
		"service-cidr", "subnet", "topology-label", "version"}
	root := newRoot(io.Discard, io.Discard)
	var kg, run *pflag.FlagSet
	for _, c := range root.Commands() {
		switch c.Name() {
		case "kg":
			kg = c.Flags()
		case "run":
			run = c.Flags()
		}
	}
	for _, name := range kgFlags {
		for cmd, fs := range map[string]*pflag.FlagSet{"kg": kg, "run": run} {
			if fs.Lookup(name) == nil {
				t.Errorf("meshlet %s has no --%s (kg's)", cmd, name)
			}
		}
	}
	for name, want := range map[string][2]string{ // kg's default, meshlet run's
		"cni": {"true", "false"}, "clean-up": {"true", "false"}, "key-file": {"/var/lib/kilo/key", "/var/lib/meshlet/key"},
		"metrics-compat": {"kilo", ""}, "cni-path": {"/etc/cni/net.d/10-kilo.conflist", "/etc/cni/net.d/10-kilo.conflist"},
		"mtu": {"auto", "auto"}, "subnet": {"10.4.0.0/16", "10.4.0.0/16"}, "listen": {":1107", ":1107"},
		"create-interface": {"true", "true"}, "local": {"true", "true"}, "encapsulate": {"always", "always"},
	} {
		if got := kg.Lookup(name).DefValue; got != want[0] {
			t.Errorf("kg --%s defaults to %q, want kg's %q", name, got, want[0])
		}
		if got := run.Lookup(name).DefValue; got != want[1] {
			t.Errorf("run --%s defaults to %q, want %q", name, got, want[1])
		}
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
