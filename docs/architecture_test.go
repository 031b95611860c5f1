package docs

import (
	"go/build"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// module is the import path every package of this repository starts with.
const module = "github.com/meshlet/meshlet/"

// tableEntry is a backticked name in the package table.
var tableEntry = regexp.MustCompile("`([^`]+)`")

// TestArchitecturePackageTable holds docs/architecture.md's package table
// to the code: a row per package that ships in the binary (not tests, not
// the e2e harness), and its imports column exactly the meshlet packages
// it imports — every import covered by an entry, every entry covering an
// import (`core/*` covers the agent/core packages it imports, and must
// cover one). The row of cmd/meshlet names every command.
func TestArchitecturePackageTable(t *testing.T) {
	rows := packageTable(t)
	pkgs := productionPackages(t)
	for _, p := range pkgs {
		if _, ok := rows[p]; !ok {
			t.Errorf("docs/architecture.md#packages: no row for %s", p)
		}
	}
	for p, row := range rows {
		if !slices.Contains(pkgs, p) {
			t.Errorf("docs/architecture.md#packages: row %s names no package of the repository", p)
			continue
		}
		checkImports(t, p, row.imports, meshletImports(t, p))
	}
	for _, c := range commands(t) {
		if !strings.Contains(rows["cmd/meshlet"].owns, "`"+c+"`") {
			t.Errorf("docs/architecture.md#packages: the row of cmd/meshlet does not name its command `%s`", c)
		}
	}
}

type packageRow struct {
	owns    string
	imports []string
}

// packageTable reads the table under "## Packages": package → its row.
func packageTable(t *testing.T) map[string]packageRow {
	t.Helper()
	b, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]packageRow{}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "## "):
			in = line == "## Packages"
			continue
		case !in || !strings.HasPrefix(line, "| `"):
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) != 3 {
			t.Fatalf("docs/architecture.md#packages: row %q has %d cells, want 3", line, len(cells))
		}
		name := strings.Trim(strings.TrimSpace(cells[0]), "`")
		if _, dup := rows[name]; dup {
			t.Errorf("docs/architecture.md#packages: two rows for %s", name)
		}
		row := packageRow{owns: cells[1]}
		for _, m := range tableEntry.FindAllStringSubmatch(cells[2], -1) {
			row.imports = append(row.imports, m[1])
		}
		rows[name] = row
	}
	if len(rows) == 0 {
		t.Fatal("docs/architecture.md: no package table under ## Packages")
	}
	return rows
}

// productionPackages lists the directories (relative to the repository)
// with non-test Go files under the trees that make the binary.
func productionPackages(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, root := range []string{"agent", "cmd", "wg", "netlinkx", "xtables"} {
		err := filepath.WalkDir(filepath.Join("..", root), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "testdata" {
				return filepath.SkipDir
			}
			if d.IsDir() {
				if _, err := build.ImportDir(p, 0); err == nil {
					rel, _ := filepath.Rel("..", p)
					out = append(out, filepath.ToSlash(rel))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// meshletImports is what package p (relative to the repository) imports of
// this repository, in the table's spelling (agent/ left out).
func meshletImports(t *testing.T, p string) []string {
	t.Helper()
	bp, err := build.ImportDir(filepath.Join("..", p), 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, imp := range bp.Imports {
		if rel, ok := strings.CutPrefix(imp, module); ok {
			out = append(out, strings.TrimPrefix(rel, "agent/"))
		}
	}
	return out
}

func checkImports(t *testing.T, p string, entries, actual []string) {
	t.Helper()
	for _, imp := range actual {
		if !slices.ContainsFunc(entries, func(e string) bool { ok, _ := path.Match(e, imp); return ok }) {
			t.Errorf("docs/architecture.md#packages: %s imports %s, its row does not say so", p, imp)
		}
	}
	for _, e := range entries {
		if !slices.ContainsFunc(actual, func(imp string) bool { ok, _ := path.Match(e, imp); return ok }) {
			t.Errorf("docs/architecture.md#packages: the row of %s says it imports %s; it does not", p, e)
		}
	}
}

// useLine is a cobra command's name in cmd/meshlet's source.
var useLine = regexp.MustCompile(`(?m)^\s*Use:\s+"([a-z]+)`)

// commands lists meshlet's commands (the root left out).
func commands(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../cmd/meshlet/*.go")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range useLine.FindAllStringSubmatch(string(b), -1) {
			if m[1] != "meshlet" {
				out = append(out, m[1])
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("no cobra command found in cmd/meshlet")
	}
	return out
}
