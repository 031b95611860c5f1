// Package docs holds no code: its test checks that the repository's links
// into Markdown files resolve on GitHub.
package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// repoBlob is how the alerts' runbook URLs and other absolute links name a
// file of this repository; such links are checked like relative ones.
const repoBlob = "https://github.com/meshlet/meshlet/blob/main/"

var (
	// fileAnchor is a link or a mention of a Markdown file with an anchor
	// (name.md, '#', the anchor), with what came
	// before the path when that was a URL (to tell other sites' links apart).
	fileAnchor = regexp.MustCompile(`((?:https?://[^\s()<>\[\]"'` + "`" + `]*/)?[A-Za-z0-9_./-]*\.md)#([A-Za-z0-9_-]*)`)
	// sameFile is a Markdown link to an anchor of the file it is in.
	sameFile   = regexp.MustCompile(`\]\(#([A-Za-z0-9_-]+)\)`)
	atxHeading = regexp.MustCompile(`^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$`)
	explicitID = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	htmlTag    = regexp.MustCompile(`<[^>]*>`)
	mdLink     = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// slug is GitHub's anchor for a heading: its text as rendered, lowercase,
// every character that is not a letter, digit, mark, '_', '-' or space
// removed, spaces made '-' (github-slugger, which GitHub's renderer follows).
func slug(heading string) string {
	text := mdLink.ReplaceAllString(heading, "$1")
	text = htmlTag.ReplaceAllString(text, "")
	text = strings.NewReplacer("`", "", "*", "").Replace(text)
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.M, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns every anchor GitHub renders for a Markdown text: each
// heading's slug (a repeated slug gets -1, -2, … as on GitHub) and every
// explicit <a id="…"> or <a name="…">. Headings in fenced code are text.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fence := ""
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if fence == "" && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")) {
			fence = trimmed[:3]
			continue
		}
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		for _, m := range explicitID.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		if m := atxHeading.FindStringSubmatch(line); m != nil {
			s := slug(m[1])
			if n := seen[s]; n > 0 {
				out[s+"-"+strconv.Itoa(n)] = true
			} else {
				out[s] = true
			}
			seen[s]++
		}
	}
	return out
}

func TestSlug(t *testing.T) {
	for _, tc := range []struct{ heading, want string }{
		{"Liveness of remote nodes", "liveness-of-remote-nodes"},
		{"A Peer's keepalive is applied", "a-peers-keepalive-is-applied"},
		{"`/status` is not on the network", "status-is-not-on-the-network"},
		{"Health: stepping aside", "health-stepping-aside"},
		{"Mixed clusters: kg and meshlet nodes together", "mixed-clusters-kg-and-meshlet-nodes-together"},
		{"MeshletPeerDown", "meshletpeerdown"},
		{"make e2e-node (real kubelets)", "make-e2e-node-real-kubelets"},
		{"[Two schemas](#two-schemas) of **ClusterMesh**", "two-schemas-of-clustermesh"},
		{"snake_case × 2", "snake_case--2"},
	} {
		if got := slug(tc.heading); got != tc.want {
			t.Errorf("slug(%q) = %q, want %q", tc.heading, got, tc.want)
		}
	}
}

func TestAnchors(t *testing.T) {
	got := anchors("# Title\n<a id=\"x\"></a>\n## Part\n## Part\n```\n## not a heading\n```\n- <a id=\"kilo\"></a>**kilo**\n")
	for _, want := range []string{"title", "x", "part", "part-1", "kilo"} {
		if !got[want] {
			t.Errorf("anchor %q missing from %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Errorf("a heading in fenced code became an anchor: %v", got)
	}
}

// TestLinksResolve: every anchored link to a Markdown file in the
// repository's Markdown and Go sources (links, mentions in prose, comments
// and messages, the alerts' runbook URLs) names a Markdown file of the
// repository — relative to the file it is in, or to the repository's root as
// comments and messages write it — and an anchor GitHub renders in it;
// likewise every [text](#anchor) within a Markdown file.
func TestLinksResolve(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	cache := map[string]map[string]bool{}
	anchorsOf := func(path string) (map[string]bool, bool) {
		if a, ok := cache[path]; ok {
			return a, a != nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			cache[path] = nil
			return nil, false
		}
		cache[path] = anchors(string(b))
		return cache[path], true
	}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (name == ".git" || name == "vendor" || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		isMD := strings.HasSuffix(path, ".md")
		if !isMD && !strings.HasSuffix(path, ".go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for i, line := range strings.Split(string(b), "\n") {
			where := rel + ":" + strconv.Itoa(i+1)
			for _, m := range fileAnchor.FindAllStringSubmatch(line, -1) {
				target, anchor := m[1], m[2]
				if strings.Contains(target, "://") {
					if !strings.HasPrefix(target, repoBlob) {
						continue // another site's page
					}
					target = filepath.Join(root, strings.TrimPrefix(target, repoBlob))
				}
				if anchor == "" {
					continue // a prefix the code completes (manifests_test.go's runbook URLs)
				}
				checked++
				var a map[string]bool
				found := false
				for _, candidate := range []string{filepath.Join(filepath.Dir(path), target), filepath.Join(root, target)} {
					if filepath.IsAbs(target) {
						candidate = target
					}
					if a, found = anchorsOf(candidate); found {
						break
					}
				}
				switch {
				case !found:
					t.Errorf("%s: %s#%s: no such file (relative to %s or the repository's root)", where, m[1], anchor, filepath.Dir(rel))
				case !a[anchor]:
					t.Errorf("%s: %s#%s: no heading with that slug and no <a id=%q></a> in the file", where, m[1], anchor, anchor)
				}
			}
			if !isMD {
				continue
			}
			for _, m := range sameFile.FindAllStringSubmatch(line, -1) {
				checked++
				if a, _ := anchorsOf(path); !a[m[1]] {
					t.Errorf("%s: (#%s): no heading with that slug and no <a id=%q></a> in this file", where, m[1], m[1])
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked == 0 {
		t.Fatal("no link with an anchor found: the walk missed the repository")
	}
	t.Logf("%d links with anchors checked", checked)
}
