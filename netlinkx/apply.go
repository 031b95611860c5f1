package netlinkx

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// Report says what Apply changed.
type Report struct {
	Link     LinkReport     `json:"link"`
	Tunnel   string         `json:"tunnel,omitempty"`
	Sysctls  []string       `json:"sysctls,omitempty"`
	Routes   RouteReport    `json:"routes"`
	Rules    RuleReport     `json:"rules"`
	Firewall FirewallReport `json:"firewall"`
}

// Counts is how many objects the apply changed, by kind (route, rule,
// address, iptables, sysctl, link), in the form every actuator reports
// (meshlet_dataplane_changes_total).
func (r Report) Counts() map[string]int {
	c := map[string]int{
		"route":    len(r.Routes.Replaced) + len(r.Routes.Deleted),
		"rule":     len(r.Rules.Added) + len(r.Rules.Deleted),
		"address":  len(r.Link.AddedAddrs) + len(r.Link.RemovedAddrs),
		"iptables": len(r.Firewall.Changes),
		"sysctl":   len(r.Sysctls),
	}
	if r.Link.MTUChanged || r.Link.StateChanged {
		c["link"] = 1
	}
	return c
}

// Changed reports whether anything was changed.
func (r Report) Changed() bool {
	return r.Link.MTUChanged || r.Link.StateChanged || len(r.Link.AddedAddrs)+len(r.Link.RemovedAddrs) > 0 ||
		len(r.Sysctls) > 0 || len(r.Routes.Replaced)+len(r.Routes.Deleted) > 0 ||
		len(r.Rules.Added)+len(r.Rules.Deleted) > 0 || len(r.Firewall.Changes) > 0
}

// Apply reconciles the host with spec: tunnel, link, sysctls, routes, rules,
// firewall, in that order (routes need their devices up and addressed). A
// failing step does not stop the independent later ones; all errors are
// returned joined, and the agent retries on its next pass.
//
// The spec the last Apply made true is kept: applying it again reads
// nothing while Watch reports no event and Options.Recheck has not passed
// (upToDate), so an idle agent's runs fork no iptables and dump no routes
// (docs/performance.md#idle).
func (h *Host) Apply(ctx context.Context, spec Spec) (rep Report, err error) {
	h.applyMu.Lock()
	defer h.applyMu.Unlock()
	events, watched := h.Events()
	if h.upToDate(spec, events, watched) {
		return Report{}, ctx.Err()
	}
	h.applied = nil
	started := h.clock.Now()
	defer func() {
		if err == nil {
			h.applied = &verified{spec: cloneSpec(spec), events: events, watched: watched, at: started}
		}
	}()
	var errs []error

	var tunnel string
	tunnel, err = h.EnsureTunnel(ctx, spec.Tunnel)
	if err != nil {
		errs = append(errs, err)
	}
	rep.Tunnel = tunnel

	if spec.Link.Name != "" {
		rep.Link, err = h.EnsureLink(ctx, spec.Link)
		if err != nil {
			errs = append(errs, err)
		}
	}
	rep.Sysctls, err = h.EnsureSysctls(ctx, DesiredSysctls(spec.Link.Name, tunnel, spec.IPv6Forwarding))
	if err != nil {
		errs = append(errs, err)
	}
	rep.Routes, err = h.ReconcileRoutes(ctx, spec.Routes, spec.Link.Name)
	if err != nil {
		errs = append(errs, err)
	}
	for _, c := range rep.Routes.Conflicts {
		h.log.Warn("route left to the host", "route", c)
	}
	rep.Rules, err = h.ReconcileRules(ctx, spec.Rules)
	if err != nil {
		errs = append(errs, err)
	}
	rep.Firewall, err = h.EnsureFirewall(ctx, spec.Firewall)
	if err != nil {
		errs = append(errs, err)
	}
	if rep.Changed() {
		h.log.Info("host network applied",
			"mtu", rep.Link.MTU, "linkStateChanged", rep.Link.StateChanged,
			"addressesAdded", len(rep.Link.AddedAddrs), "addressesRemoved", len(rep.Link.RemovedAddrs),
			"sysctls", rep.Sysctls, "routesReplaced", len(rep.Routes.Replaced), "routesDeleted", len(rep.Routes.Deleted),
			"rulesAdded", len(rep.Rules.Added), "rulesDeleted", len(rep.Rules.Deleted),
			"firewallChanges", len(rep.Firewall.Changes))
	}
	return rep, errors.Join(errs...)
}

// CleanupOptions configure Cleanup.
type CleanupOptions struct {
	// Interface is deleted when DeleteInterface is set.
	Interface       string
	DeleteInterface bool
}

// Cleanup removes everything meshlet installed: its chains and the jumps to
// them (IPv4 and IPv6), its routes and rules in every table, and the
// interface if asked. Sysctls are left as they are (other software relies on
// ip_forward). Missing pieces are not an error, so it is safe to run twice.
func (h *Host) Cleanup(ctx context.Context, opts CleanupOptions) error {
	h.applyMu.Lock()
	defer h.applyMu.Unlock()
	h.applied = nil
	h.forgetAbsent()
	var errs []error
	if _, err := h.EnsureFirewall(ctx, Firewall{}); err != nil {
		errs = append(errs, err)
	}
	if _, err := h.ReconcileRoutes(ctx, nil, ""); err != nil {
		errs = append(errs, err)
	}
	if _, err := h.ReconcileRules(ctx, nil); err != nil {
		errs = append(errs, err)
	}
	if opts.DeleteInterface && opts.Interface != "" {
		l, err := h.nl.LinkByName(opts.Interface)
		switch {
		case err == nil:
			if err := h.nl.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("netlinkx: delete %s: %w", opts.Interface, err))
			}
		case !errors.As(err, new(netlink.LinkNotFoundError)):
			errs = append(errs, fmt.Errorf("netlinkx: look up %s: %w", opts.Interface, err))
		}
	}
	return errors.Join(errs...)
}

// Addresses lists the addresses on a link (for tests and diagnostics).
func (h *Host) Addresses(name string) ([]netip.Prefix, error) {
	l, err := h.nl.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("netlinkx: link %s: %w", name, err)
	}
	as, err := h.nl.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("netlinkx: addresses of %s: %w", name, err)
	}
	var out []netip.Prefix
	for _, a := range as {
		if p, ok := prefixOf(a.IPNet); ok {
			out = append(out, p)
		}
	}
	return out, nil
}
