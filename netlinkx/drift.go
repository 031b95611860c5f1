package netlinkx

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
)

// Drift is how meshlet's routes and rules on the host differ from a spec,
// without changing anything (`meshlet status`): what an Apply would
// replace, add or delete.
type Drift struct {
	// Link lists how the WireGuard link differs (missing, down, MTU,
	// addresses).
	Link   []string    `json:"link,omitempty"`
	Routes RouteReport `json:"routes"`
	Rules  RuleReport  `json:"rules"`
}

// Changed reports whether the host differs from the spec.
func (d Drift) Changed() bool { return len(d.Lines()) > 0 }

// Lines is the drift for people, one difference per line.
func (d Drift) Lines() []string {
	out := append([]string(nil), d.Link...)
	for _, r := range d.Routes.Replaced {
		out = append(out, "route missing or different: "+r)
	}
	for _, r := range d.Routes.Deleted {
		out = append(out, "route not in the plan: "+r)
	}
	for _, r := range d.Rules.Added {
		out = append(out, "rule missing: "+r)
	}
	for _, r := range d.Rules.Deleted {
		out = append(out, "rule not in the plan: "+r)
	}
	return out
}

// linkDrift compares the link with its spec.
func (h *Host) linkDrift(spec LinkSpec) ([]string, error) {
	if spec.Name == "" {
		return nil, nil
	}
	link, err := h.nl.LinkByName(spec.Name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return []string{"link " + spec.Name + " missing"}, nil
		}
		return nil, fmt.Errorf("netlinkx: link %s: %w", spec.Name, err)
	}
	var out []string
	if spec.Up && link.Attrs().Flags&net.FlagUp == 0 {
		out = append(out, "link "+spec.Name+" down")
	}
	if spec.MTU > 0 && link.Attrs().MTU != spec.MTU {
		out = append(out, fmt.Sprintf("link %s MTU %d, plan %d", spec.Name, link.Attrs().MTU, spec.MTU))
	}
	add, del, err := h.addrDiff(link, spec)
	if err != nil {
		return out, err
	}
	for _, p := range add {
		out = append(out, fmt.Sprintf("link %s lacks address %s", spec.Name, p))
	}
	for _, p := range del {
		out = append(out, fmt.Sprintf("link %s has address %s not in the plan", spec.Name, p))
	}
	return out, nil
}

// Drift compares the host's meshlet routes and rules with spec.
func (h *Host) Drift(ctx context.Context, spec Spec) (Drift, error) {
	var d Drift
	if err := ctx.Err(); err != nil {
		return d, err
	}
	var errs []error
	var err error
	if d.Link, err = h.linkDrift(spec.Link); err != nil {
		errs = append(errs, err)
	}
	want, noDevice, routeErrs := h.kernelRoutes(spec.Routes)
	errs = append(errs, routeErrs...)
	for _, r := range noDevice {
		d.Routes.Replaced = append(d.Routes.Replaced, fmt.Sprintf("%s dev %s (no such device)", r.Dst, r.Dev))
	}
	current, err := h.ownRoutes()
	if err != nil {
		return d, errors.Join(append(errs, err)...)
	}
	replace, del := diffRoutes(want, current)
	for _, r := range replace {
		d.Routes.Replaced = append(d.Routes.Replaced, r.String())
	}
	for _, r := range del {
		d.Routes.Deleted = append(d.Routes.Deleted, r.String())
	}
	wantRules := make([]kernelRule, 0, len(spec.Rules))
	for _, r := range spec.Rules {
		wantRules = append(wantRules, kernelRuleOf(r))
	}
	currentRules, err := h.ownRules()
	if err != nil {
		return d, errors.Join(append(errs, err)...)
	}
	add, delRules := diffRules(wantRules, currentRules)
	for _, r := range add {
		d.Rules.Added = append(d.Rules.Added, r.String())
	}
	for _, r := range delRules {
		d.Rules.Deleted = append(d.Rules.Deleted, r.String())
	}
	return d, errors.Join(errs...)
}
