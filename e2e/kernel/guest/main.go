// Command guest is the kernel lane's scenario runner. It runs inside a QEMU
// guest booted with the Debian cloud kernel (hack/kernel/run.sh builds the
// initramfs; its /init runs `guest run` and powers off), where kernel
// WireGuard and IPIP exist, and proves meshlet's kernel datapath: a
// non-leader reaches a pod of another location only through its leader,
// over the IPIP device cilium_tunl, the leader forwards through kernel
// WireGuard (kilo0), and replies return through table 1107.
//
// Every result is one line on stdout, "PASS <name>" or "FAIL <name>: <why>";
// run.sh compares the PASS lines with the list `guest steps` prints.
//
// Subcommands:
//
//	run             set up the namespaces, apply every node, check (PID 1's child)
//	steps           list the names of the checks, one a line
//	plans           print the scenario's plans as JSON (works on any host)
//	apply FILE      apply one node's plan in the current network namespace
//	                (re-executed by run through `ip netns exec NODE`)
//	wgshow IFACE    print the WireGuard device as JSON (same)
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "run":
		os.Exit(run())
	case "steps":
		for _, s := range steps {
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

func usage() {
	fmt.Fprintln(os.Stderr, "usage: guest run | steps | plans | apply FILE | wgshow IFACE")
	os.Exit(2)
}
