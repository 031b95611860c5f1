// Command meshlet is the node agent that owns Kilo's WireGuard interface on
// its node and joins several clusters into one mesh.
//
//	meshlet run       the agent (DaemonSet)
//	meshlet plan      the planner on files (kubectl dumps): what a node would do
//	meshlet cleanup   remove what meshlet installed (uninstall)
//	meshlet version
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// version is set by the build (-X main.version=...).
var version = "dev"

func usage(w io.Writer) {
	fmt.Fprint(w, `meshlet — a WireGuard mesh agent for Kilo clusters

Usage:
  meshlet run [flags]        run the node agent
  meshlet plan [flags]       compute a node's plan from kubectl dumps
  meshlet cleanup [flags]    remove meshlet's interface, routes, rules and chains
  meshlet version            print the version

Run "meshlet COMMAND -h" for the flags of a command.
`)
}

func main() {
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	args := os.Args[2:]
	switch os.Args[1] {
	case "run":
		err = runAgent(ctx, args)
	case "plan":
		err = runPlan(ctx, args, os.Stdout)
	case "cleanup":
		err = runCleanup(ctx, args)
	case "version", "--version", "-version":
		fmt.Println("meshlet", version)
	case userspaceCommand:
		err = runUserspaceDevice(ctx, args)
	case "help", "-h", "--help":
		usage(os.Stdout)
	default:
		fmt.Fprintf(os.Stderr, "meshlet: unknown command %q\n\n", os.Args[1])
		usage(os.Stderr)
		os.Exit(2)
	}
	if err != nil {
		slog.Error("meshlet "+os.Args[1]+" failed", "error", err)
		fmt.Fprintf(os.Stderr, "meshlet %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func newLogger(level string) *slog.Logger {
	var l slog.Level
	switch level {
	case "debug":
		l = slog.LevelDebug
	case "warn":
		l = slog.LevelWarn
	case "error":
		l = slog.LevelError
	default:
		l = slog.LevelInfo
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}
