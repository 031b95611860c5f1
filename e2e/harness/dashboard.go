package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
)

// unfilled matches a variable left in a query: $name or ${name}, a name
// that starts with a letter or an underscore.
var unfilled = regexp.MustCompile(`\$\{?[A-Za-z_]`)

// DashboardQuery is one query of a Grafana dashboard's panel.
type DashboardQuery struct {
	Panel, RefID, Expr string
	Instant            bool
}

// DashboardQueries returns every panel's queries (panels inside rows too) of
// the Grafana dashboard JSON at path, with the dashboard's variables ($name
// and ${name}) replaced by vars. A query that still names a variable is an
// error, so a variable added to the dashboard must be given here too; a
// regular expression's group reference ($1, ${1} in label_replace) is not a
// variable (Grafana leaves names it does not know as they are).
func DashboardQueries(path string, vars map[string]string) ([]DashboardQuery, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	type panel struct {
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			RefID   string `json:"refId"`
			Expr    string `json:"expr"`
			Instant bool   `json:"instant"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var d struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	// Longest names first, so $node_name is not replaced as $node.
	names := make([]string, 0, len(vars))
	for n := range vars {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return len(names[i]) > len(names[j]) })
	var pairs []string
	for _, n := range names {
		pairs = append(pairs, "${"+n+"}", vars[n], "$"+n, vars[n])
	}
	subst := strings.NewReplacer(pairs...)
	var out []DashboardQuery
	var walk func(raw []json.RawMessage) error
	walk = func(raw []json.RawMessage) error {
		for _, r := range raw {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				return err
			}
			if p.Type != "row" && len(p.Targets) == 0 {
				return fmt.Errorf("panel %q has no query", p.Title)
			}
			for _, t := range p.Targets {
				q := DashboardQuery{Panel: p.Title, RefID: t.RefID, Expr: subst.Replace(t.Expr), Instant: t.Instant}
				if strings.TrimSpace(t.Expr) == "" || unfilled.MatchString(q.Expr) {
					return fmt.Errorf("panel %q query %s: %q (empty, or a variable without a value)", p.Title, t.RefID, q.Expr)
				}
				out = append(out, q)
			}
			if err := walk(p.Panels); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(d.Panels); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}
