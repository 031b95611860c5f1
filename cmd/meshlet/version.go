package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Set by the build (make build, hack/image/build.sh, make release):
//
//	-X main.version=v0.1.0 -X main.commit=<40 hex> -X main.date=<RFC 3339>
//
// date is the commit's time (SOURCE_DATE_EPOCH), not the wall clock, so the
// same commit gives the same binary.
var (
	version = "dev"
	commit  = ""
	date    = ""
)

// buildInfo is what `meshlet version` prints.
type buildInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	Date      string `json:"date"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// currentBuild is the stamped version, with the commit and date the Go
// toolchain recorded (go build with VCS stamping) where the build set none.
func currentBuild() buildInfo {
	b := buildInfo{Version: version, Commit: commit, Date: date, GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && b.Commit == "":
				b.Commit = s.Value
			case s.Key == "vcs.time" && b.Date == "":
				b.Date = s.Value
			}
		}
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	if b.Date == "" {
		b.Date = "unknown"
	}
	return b
}

func (b buildInfo) print(w io.Writer) {
	fmt.Fprintf(w, "meshlet %s\n", b.Version)
	fmt.Fprintf(w, "  commit:   %s\n", b.Commit)
	fmt.Fprintf(w, "  built:    %s\n", b.Date)
	fmt.Fprintf(w, "  go:       %s %s\n", b.GoVersion, b.Platform)
}

func newVersionCmd() *cobra.Command {
	var output *outputFlag
	var short bool
	c := &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and build date",
		Long: "Print meshlet's version (a release's semver tag), the commit it was built from and the build date (the\n" +
			"commit's time). --short prints the version alone, as kg's `version` does; `meshlet --version` prints one line.",
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := output.check(); err != nil {
				return err
			}
			b := currentBuild()
			switch {
			case short:
				fmt.Fprintln(c.OutOrStdout(), b.Version)
			case output.value == "json":
				enc := json.NewEncoder(c.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(b)
			default:
				b.print(c.OutOrStdout())
			}
			return nil
		},
	}
	output = registerOutput(c.Flags(), "text", "json")
	c.Flags().BoolVar(&short, "short", false, "print the version alone")
	return c
}
