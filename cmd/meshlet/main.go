// Command meshlet is the node agent that owns Kilo's WireGuard interface on
// its node and joins several clusters into one mesh.
//
//	meshlet run        the agent (DaemonSet)
//	meshlet status     what the running agent on this node does
//	meshlet diagnose   a cluster's mesh, checked from the API
//	meshlet graph      the mesh as Graphviz dot
//	meshlet plan       the planner on files (kubectl dumps): what a node would do
//	meshlet cleanup    remove what meshlet installed (uninstall)
//	meshlet version
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// usageError is a wrong command line (exit status 2); any other error is a
// failure at run time (exit status 1).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usage marks err as a wrong command line.
func usage(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err}
}

// helpWidth is the widest line --help prints: the flags' usages are
// wrapped to it, the rest is written to fit (TestHelpText).
const helpWidth = 120

// newRoot is meshlet's command tree; out and errOut are where commands
// print (tests pass buffers).
func newRoot(out, errOut io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "meshlet",
		Short: "meshlet — a WireGuard mesh agent for Kilo clusters",
		Long: "meshlet owns Kilo's WireGuard interface on its node, computes the node's state with Kilo's topology rules,\n" +
			"and joins several clusters into one mesh (README.md).",
		SilenceUsage:  true,
		SilenceErrors: true,
		// meshlet --version: one line, as kg's and kgctl's --version.
		Version: version,
	}
	root.SetVersionTemplate("meshlet {{.Version}}\n")
	root.SetOut(out)
	root.SetErr(errOut)
	// A wrong flag is a usage error: one line and a hint, not the whole
	// usage.
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usage(fmt.Errorf("%w (see '%s --help')", err, c.CommandPath()))
	})
	// kg's flags explain themselves at length: their usages are wrapped
	// to helpWidth (cobra's template, FlagUsagesWrapped for FlagUsages),
	// under the usage column.
	root.SetUsageTemplate(strings.ReplaceAll(root.UsageTemplate(), ".FlagUsages ", fmt.Sprintf(".FlagUsagesWrapped %d ", helpWidth)))
	// meshlet --version only: a command line that starts with a flag is
	// kg's (execute), and kg has no -v.
	root.Flags().Bool("version", false, "print the version")
	root.AddCommand(newRunCmd(), newKgCmd(), newStatusCmd(), newDiagnoseCmd(), newGraphCmd(), newPlanCmd(), newCleanupCmd(),
		newVersionCmd(), newWebhookCmd(), newUserspaceDeviceCmd())
	return root
}

// execute runs the command line args and returns the exit status; the one
// error line goes to errOut.
func execute(ctx context.Context, args []string, out, errOut io.Writer) int {
	root := newRoot(out, errOut)
	implicitKg := kgMode(args)
	if implicitKg {
		// Kilo's DaemonSet passes kg's flags to the image's entrypoint,
		// without a command. The user typed no "kg": the error line
		// names what they typed, and a wrong flag says whose flags these
		// are.
		args = append([]string{"kg"}, args...)
		root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
			return usage(fmt.Errorf("%w (flags without a command are kg's: see 'meshlet kg --help')", err))
		})
	}
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	name := "meshlet"
	if cmd != nil && !(implicitKg && cmd.Parent() == root) {
		name = cmd.CommandPath()
	}
	fmt.Fprintf(errOut, "%s: %v\n", name, err)
	var ue usageError
	if errors.As(err, &ue) || cmd == nil || cmd == root {
		return 2
	}
	return 1
}

// outputFlag is every command's -o/--output: the first format is the
// default; check rejects any other value with one wording.
type outputFlag struct {
	value   string
	formats []string
}

func registerOutput(fs *pflag.FlagSet, formats ...string) *outputFlag {
	o := &outputFlag{formats: formats}
	fs.StringVarP(&o.value, "output", "o", formats[0], "output format: "+oneOf(formats))
	return o
}

func (o *outputFlag) check() error {
	if slices.Contains(o.formats, o.value) {
		return nil
	}
	return usage(fmt.Errorf("--output: %q must be %s", o.value, oneOf(o.formats)))
}

// oneOf is "a, b or c".
func oneOf(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	args := os.Args[1:]
	if filepath.Base(os.Args[0]) == "kg" {
		args = append([]string{"kg"}, args...) // a binary called kg: kg's command line
	}
	code := execute(ctx, args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func newLogger(level string) *slog.Logger {
	var l slog.Level
	switch level {
	case "none":
		return slog.New(slog.DiscardHandler)
	case "all", "debug":
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
