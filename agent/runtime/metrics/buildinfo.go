package metrics

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// NewBuildInfo registers meshlet_build_info{version, goversion}, always 1.
// Its presence is what marks a target as a meshlet agent whatever the
// scrape job or the DaemonSet is called (the drop-in runs as Kilo's "kilo"):
// the shipped alerts and dashboard key on it (docs/metrics.md#alerts), and
// `count by (version)` shows a rolling image swap's progress.
func NewBuildInfo(reg prometheus.Registerer, version string) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meshlet_build_info",
		Help: "Always 1: meshlet's version and the Go version it was built with."}, []string{"version", "goversion"})
	g.WithLabelValues(version, runtime.Version()).Set(1)
	reg.MustRegister(g)
}
