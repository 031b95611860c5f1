// Package xtables picks the iptables backend meshlet runs: the one the host
// uses. iptables 1.8 comes as two programs over two kernel subsystems,
// "nft" (nf_tables) and "legacy" (x_tables); rules written with one are
// invisible to the other and ordered apart from the host's, so a container
// must use whichever the host's kube-proxy, kubelet and CNI use. The rule is
// the field's (kubernetes-sigs' iptables-wrappers; hack/image/README.md): the backend
// that already holds the host's rules.
//
// The image carries one directory per backend (DefaultDir/nft,
// DefaultDir/legacy) whose iptables, ip6tables, *-save and *-restore are
// that backend's multi-call binary under the plain names; Select puts the
// chosen one first in PATH, so go-iptables (netlinkx) and everything else
// that runs "iptables" gets that backend.
package xtables

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"time"
)

// Backend is an iptables backend.
type Backend string

const (
	NFT    Backend = "nft"
	Legacy Backend = "legacy"
)

// Modes of --iptables-backend.
const (
	ModeAuto   = "auto"   // detect the host's backend (Detect)
	ModeSystem = "system" // the iptables found in PATH, as it is
)

// DefaultDir holds the per-backend directories in meshlet's image
// (hack/image/customize.sh creates them).
const DefaultDir = "/usr/lib/meshlet/xtables"

// Runner runs a program and returns its standard output.
type Runner func(ctx context.Context, name string, args ...string) ([]byte, error)

// Exec is the Runner that executes programs.
func Exec(ctx context.Context, name string, args ...string) ([]byte, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout = &out
	err := cmd.Run()
	return out.Bytes(), err
}

// kubelet (1.17 and later) creates one of these in the mangle table with
// the host's backend precisely so that containers can tell.
var kubeletChains = regexp.MustCompile(`(?m)^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY) `)

// rules counts rule lines ("-A ...") of iptables-save output.
var ruleLine = regexp.MustCompile(`(?m)^-A `)

// Detect returns the backend the host's rules are in, and why:
//  1. kubelet's hint chains: nft first (iptables-nft-save -t mangle is cheap
//     and nft is the common case), then legacy (the whole save: "-t mangle"
//     would make the legacy kernel module create that table);
//  2. else the backend holding more rules, IPv4 and IPv6 together (what the
//     wrappers did before kubelet had hints; a legacy tie wins, as there);
//  3. else nft, the default of current distributions.
//
// Failures of the programs count as no output: a host without one backend's
// kernel support simply holds no rules there.
func Detect(ctx context.Context, run Runner) (Backend, string) {
	save := func(multi, cmd string, args ...string) []byte {
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		out, _ := run(c, multi, append([]string{cmd}, args...)...)
		return out
	}
	// Each output is read on its own: one cut short (a timeout) does not
	// run its last line into the next output's first.
	nft4 := save("xtables-nft-multi", "iptables-save", "-t", "mangle")
	nft6 := save("xtables-nft-multi", "ip6tables-save", "-t", "mangle")
	if kubeletChains.Match(nft4) || kubeletChains.Match(nft6) {
		return NFT, "kubelet's hint chain is in the nft mangle table"
	}
	leg4, leg6 := save("xtables-legacy-multi", "iptables-save"), save("xtables-legacy-multi", "ip6tables-save")
	if kubeletChains.Match(leg4) || kubeletChains.Match(leg6) {
		return Legacy, "kubelet's hint chain is in the legacy mangle table"
	}
	nft4, nft6 = save("xtables-nft-multi", "iptables-save"), save("xtables-nft-multi", "ip6tables-save")
	nLeg := len(ruleLine.FindAllIndex(leg4, -1)) + len(ruleLine.FindAllIndex(leg6, -1))
	nNFT := len(ruleLine.FindAllIndex(nft4, -1)) + len(ruleLine.FindAllIndex(nft6, -1))
	switch {
	case nLeg > 0 && nLeg >= nNFT:
		return Legacy, fmt.Sprintf("no kubelet hint; legacy holds %d rules, nft %d", nLeg, nNFT)
	case nNFT > 0:
		return NFT, fmt.Sprintf("no kubelet hint; nft holds %d rules, legacy %d", nNFT, nLeg)
	}
	return NFT, "no rules in either backend: nft, the distributions' default"
}

// Select applies --iptables-backend: mode is auto, nft, legacy or system,
// dir the parent of the per-backend directories. It returns the backend in
// use ("system" when PATH is left as it is).
func Select(ctx context.Context, mode, dir string, run Runner, log *slog.Logger) (string, error) {
	if log == nil {
		log = slog.Default()
	}
	var b Backend
	switch mode {
	case ModeSystem:
		return ModeSystem, nil
	case string(NFT), string(Legacy):
		b = Backend(mode)
	case ModeAuto, "":
		bdir := filepath.Join(dir, string(NFT))
		if _, err := os.Stat(bdir); err != nil {
			// Outside the image (a host install, the e2e lanes): the host's
			// own iptables in PATH is already its backend.
			log.Debug("no per-backend iptables directories, using the iptables in PATH", "dir", dir)
			return ModeSystem, nil
		}
		var why string
		b, why = Detect(ctx, run)
		log.Info("iptables backend detected", "backend", string(b), "reason", why)
	default:
		return "", fmt.Errorf("--iptables-backend %q: want auto, nft, legacy or system", mode)
	}
	bdir := filepath.Join(dir, string(b))
	if _, err := os.Stat(filepath.Join(bdir, "iptables")); err != nil {
		return "", fmt.Errorf("iptables backend %s: %w", b, err)
	}
	if err := os.Setenv("PATH", bdir+string(os.PathListSeparator)+os.Getenv("PATH")); err != nil {
		return "", fmt.Errorf("setting PATH: %w", err)
	}
	return string(b), nil
}
