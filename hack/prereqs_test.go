package hack

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPrereqs runs hack/prereqs.sh, as make does before anything else, with
// a PATH of stand-ins (go printing a version, id, apt-get, dpkg-query): each
// missing prerequisite is one line on stderr naming it, exit status 2;
// everything there is silence and 0.
func TestPrereqs(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	want := goModVersion(t)
	const debian = "apt-get dpkg-query"
	for _, tc := range []struct {
		name string
		// goVersion is what `go env GOVERSION` prints ("": no go in
		// PATH); goErr, when set, is go's failure (stderr, exit 1).
		goVersion, goErr string
		uid              string
		tools            string // the other commands in PATH
		sudo             bool
		args             []string
		code             int
		stderr           string // substring of the one line
	}{
		{name: "all there", goVersion: "go" + want, uid: "0", tools: debian, args: []string{"--root", "demo"}},
		{name: "a newer release candidate", goVersion: "go9.1rc2", uid: "1000"},
		{name: "a development build", goVersion: "devel go9.1-1a2b3c4 Mon Jan 1 00:00:00 2046 +0000", uid: "1000"},
		{name: "no root needed", goVersion: "go" + want, uid: "1000"},
		{name: "no go", uid: "0", code: 2,
			stderr: "meshlet needs Go " + want + " or later (go.mod) and finds no go in PATH: install it from https://go.dev/dl/"},
		{name: "no go under sudo", uid: "0", sudo: true, code: 2, stderr: `(sudo resets PATH: sudo env PATH="$PATH" make ...)`},
		{name: "an old go", goVersion: "go1.21.0", uid: "0", code: 2,
			stderr: "meshlet needs Go " + want + " or later (go.mod); BIN/go is go1.21.0: install a newer one"},
		{name: "an old go that may not switch", goErr: "go: go.mod requires go >= " + want + " (running go 1.21.0; GOTOOLCHAIN=local)", uid: "0", code: 2,
			stderr: "BIN/go cannot run it: go: go.mod requires go >= " + want},
		{name: "not root", goVersion: "go" + want, uid: "1000", tools: debian, args: []string{"--root", "demo"}, code: 2,
			stderr: `make demo needs root (network namespaces, nftables, WireGuard devices, apt-get): sudo env PATH="$PATH" make demo`},
		{name: "not Debian", goVersion: "go" + want, uid: "0", args: []string{"--root", "test"}, code: 2,
			stderr: "make test needs Debian (or a derivative with apt-get and dpkg)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := t.TempDir()
			stub := func(name, script string) {
				if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			stub("id", "echo "+tc.uid)
			for _, tool := range strings.Fields(tc.tools) {
				stub(tool, "exit 0")
			}
			switch {
			case tc.goErr != "":
				stub("go", "echo 'go: downloading nothing' >&2; echo '"+tc.goErr+"' >&2; exit 1")
			case tc.goVersion != "":
				stub("go", `[ "$1 $2" = "env GOVERSION" ] || exit 3; echo '`+tc.goVersion+`'`)
			}
			cmd := exec.Command(bash, append([]string{"prereqs.sh"}, tc.args...)...)
			cmd.Env = []string{"PATH=" + bin}
			if tc.sudo {
				cmd.Env = append(cmd.Env, "SUDO_USER=someone")
			}
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			got := strings.ReplaceAll(stderr.String(), bin, "BIN")
			t.Logf("exit status %d: %s", code, got)
			if code != tc.code {
				t.Errorf("exit status %d, want %d", code, tc.code)
			}
			if stdout.Len() > 0 {
				t.Errorf("stdout %q, want nothing", stdout.String())
			}
			switch {
			case tc.code == 0 && got != "":
				t.Errorf("stderr %q, want nothing", got)
			case tc.code != 0 && (strings.Count(got, "\n") != 1 || !strings.Contains(got, tc.stderr)):
				t.Errorf("stderr %q, want one line with %q", got, tc.stderr)
			}
		})
	}
}

// TestMakeSaysWhatIsMissing: make runs hack/prereqs.sh before it reads the
// rest of the Makefile, so a missing prerequisite is make's one line and
// exit status 2, before any build; make clean needs nothing.
func TestMakeSaysWhatIsMissing(t *testing.T) {
	// The system's directories for make's and the scripts' tools, after
	// the stand-ins; Go is not there (where it is, this test cannot hide
	// it).
	const system = "/usr/sbin:/usr/bin:/sbin:/bin"
	for _, dir := range filepath.SplitList(system) {
		if _, err := os.Stat(filepath.Join(dir, "go")); err == nil {
			t.Skipf("go in %s", dir)
		}
	}
	makeBin, err := exec.LookPath("make")
	if err != nil {
		t.Skip("no make")
	}
	want := goModVersion(t)
	for _, tc := range []struct {
		name      string
		goal      string
		goVersion string // "": no go in PATH
		uid       string
		code      int
		stderr    string
	}{
		{"no go", "unit", "", "0", 2, "*** meshlet needs Go " + want + " or later (go.mod) and finds no go in PATH"},
		{"an old go", "build", "go1.21.0", "0", 2, "*** meshlet needs Go " + want + " or later (go.mod); BIN/go is go1.21.0"},
		{"not root", "demo", "go" + want, "1000", 2, "*** make demo needs root"},
		{"clean needs nothing", "clean", "", "1000", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := t.TempDir()
			stub := func(name, script string) {
				if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			stub("id", "echo "+tc.uid)
			if tc.goVersion != "" {
				stub("go", "echo '"+tc.goVersion+"'")
			}
			// -n: nothing runs but the Makefile's own $(shell) calls.
			cmd := exec.Command(makeBin, "-n", "--no-print-directory", tc.goal)
			cmd.Dir = ".."
			cmd.Env = []string{"PATH=" + bin + ":" + system, "HOME=" + t.TempDir()}
			var stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = io.Discard, &stderr
			err := cmd.Run()
			code := 0
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			got := strings.ReplaceAll(stderr.String(), bin, "BIN")
			t.Logf("make %s: exit status %d: %s", tc.goal, code, got)
			if code != tc.code {
				t.Errorf("exit status %d, want %d", code, tc.code)
			}
			switch {
			case tc.code == 0 && got != "":
				t.Errorf("stderr %q, want nothing", got)
			case tc.code != 0 && (strings.Count(got, "\n") != 1 || !strings.Contains(got, tc.stderr)):
				t.Errorf("stderr %q, want one line with %q", got, tc.stderr)
			}
		})
	}
}

// goModVersion is go.mod's go line: the version the messages name.
func goModVersion(t *testing.T) string {
	b, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "go "); ok {
			return v
		}
	}
	t.Fatal("go.mod has no go line")
	return ""
}

// TestDocsNameGoVersion: README.md and CONTRIBUTING.md name go.mod's Go
// version as the one to install (the prerequisites a newcomer reads).
func TestDocsNameGoVersion(t *testing.T) {
	want := "Go " + goModVersion(t) + " or later"
	for _, doc := range []string{"../README.md", "../CONTRIBUTING.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), want) {
			t.Errorf("%s does not say %q (go.mod's go line)", doc, want)
		}
	}
}
