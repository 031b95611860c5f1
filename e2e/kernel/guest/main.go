// Command guest is the kernel lane's scenario runner. It runs inside a QEMU
// guest booted with the Debian cloud kernel (hack/kernel/run.sh builds the
// initramfs; its /init runs `guest run` and powers off), where kernel
// WireGuard and IPIP exist, and proves meshlet's kernel datapath (in agent
// mode with the real `meshlet run --wireguard=kernel` per node against an
// API server on the host, in plan mode with plans computed in-process): a
// non-leader reaches a pod of another location only through its leader,
// over the IPIP device cilium_tunl, the leader forwards through kernel
// WireGuard (kilo0), and replies return through table 1107.
//
// Every result is one line on stdout, "PASS <name>" or "FAIL <name>: <why>";
// run.sh compares the PASS lines with the list `guest steps` prints.
//
// Subcommands:
//
//	run [MODE]      set up the namespaces, run or apply every node, check
//	                (PID 1's child); MODE is agent or plan, default: the
//	                content of /etc/meshlet/mode, else plan
//	steps [MODE]    list the names of the checks, one a line
//	plans           print the scenario's plans as JSON (works on any host)
//	apply FILE      apply one node's plan in the current network namespace
//	                (re-executed by run through `ip netns exec NODE`)
//	wgshow IFACE    print the WireGuard device as JSON (same)
//	httpget URL     print the body of a 200 response (same; agent mode
//	                reads meshlet's /readyz and /metrics with it)
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "run":
		switch mode() {
		case "agent":
			os.Exit(runAgentMode())
		case "plan":
			os.Exit(runPlanMode())
		default:
			usage()
		}
	case "steps":
		var ss []string
		switch mode() {
		case "agent":
			ss = agentSteps
		case "plan":
			ss = planSteps
		default:
			usage()
		}
		for _, s := range ss {
			fmt.Println(s)
		}
	case "plans":
		var ks keys
		if ks, err = generateKeys(); err == nil {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			err = enc.Encode(plans(ks, time.Now()))
		}
	case "apply":
		if len(os.Args) != 3 {
			usage()
		}
		err = applyCmd(os.Args[2])
	case "httpget":
		if len(os.Args) != 3 {
			usage()
		}
		err = httpgetCmd(os.Args[2])
	case "wgshow":
		if len(os.Args) != 3 {
			usage()
		}
		err = wgshowCmd(os.Args[2])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "guest:", err)
		os.Exit(1)
	}
}

// mode is the scenario mode: the argument after run/steps, else
// /etc/meshlet/mode (run.sh writes it into the initramfs), else plan.
func mode() string {
	if len(os.Args) > 2 {
		return os.Args[2]
	}
	if b, err := os.ReadFile(filepath.Join(etcDir, "mode")); err == nil {
		return strings.TrimSpace(string(b))
	}
	return "plan"
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: guest run [agent|plan] | steps [agent|plan] | plans | apply FILE | wgshow IFACE | httpget URL")
	os.Exit(2)
}
