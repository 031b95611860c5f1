package node

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// verifyRelease is what a platform team does before it installs N from the
// registry publish.sh signed it into: hack/release/verify.sh, which must
// pass, and must refuse the same release tampered with — the chart's
// version pushed again with one line changed, the image's tag moved to
// another image (N-1's) — until the tags are back on what was signed. It
// returns what to install, by the digests verified.
func verifyRelease(ctx context.Context, t *testing.T, lane *Lane, root, tools, pub string, cur, prev Release) (image, chart string, err error) {
	reg := lane.Registry() + "/meshlet"
	verify := func() (string, error) {
		return lane.InNS(ctx, "env", tools, "PLAIN_HTTP=1", "COSIGN_PUBLIC_KEY="+pub,
			filepath.Join(root, "hack", "release", "verify.sh"), reg, cur.Version)
	}
	start := time.Now()
	out, err := verify()
	if err != nil {
		return "", "", fmt.Errorf("verify.sh refused the release publish.sh signed: %w", err)
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if v, ok := strings.CutPrefix(l, "image "); ok {
			image = v
		} else if v, ok := strings.CutPrefix(l, "chart "); ok {
			chart = v
		}
	}
	if image == "" || chart == "" {
		return "", "", fmt.Errorf("verify.sh printed no image and chart to install:\n%s", out)
	}
	t.Logf("RESULT release verified in %.1fs (the signatures of image and chart, its provenance, the SBOMs of linux/amd64 and linux/arm64): install %s, %s",
		time.Since(start).Seconds(), chart, image)
	_, chartDigest, _ := strings.Cut(chart, "@")
	_, imageDigest, _ := strings.Cut(image, "@")

	// refused: verify.sh must fail, naming what.
	refused := func(what, want string) error {
		out, err := verify()
		if err == nil {
			return fmt.Errorf("verify.sh accepted %s:\n%s", what, out)
		}
		if !strings.Contains(out, want) {
			return fmt.Errorf("verify.sh refused %s without naming it (%q):\n%s", what, want, out)
		}
		t.Logf("RESULT release: %s refused: %s", what, lastLine(out))
		return nil
	}
	tampered, err := tamperChart(lane.Dir, cur.ChartTgz)
	if err != nil {
		return "", "", err
	}
	if _, err := lane.Helm(ctx, "push", tampered, "oci://"+reg+"/charts", "--plain-http"); err != nil {
		return "", "", err
	}
	if err := refused("a chart pushed again under its version with one line changed", "chart "+reg+"/charts/meshlet:"+cur.ChartVersion); err != nil {
		return "", "", err
	}
	if _, err := lane.Crane(ctx, "tag", reg+"/charts/meshlet@"+chartDigest, cur.ChartVersion); err != nil {
		return "", "", err
	}
	if _, err := lane.Crane(ctx, "tag", reg+"/meshlet:"+prev.Version, cur.Version); err != nil {
		return "", "", err
	}
	if err := refused("the image's tag moved to another image (N-1's)", "image "+reg+"/meshlet:"+cur.Version); err != nil {
		return "", "", err
	}
	if _, err := lane.Crane(ctx, "tag", reg+"/meshlet@"+imageDigest, cur.Version); err != nil {
		return "", "", err
	}
	if out, err := verify(); err != nil || !strings.Contains(out, image) || !strings.Contains(out, chart) {
		return "", "", fmt.Errorf("verify.sh with the tags back on what was signed: %v\n%s", err, out)
	}
	return image, chart, nil
}

// tamperChart writes a copy of the chart tgz with one line added to its
// values.yaml, as a registry writer other than the release might push it.
func tamperChart(dir, tgz string) (string, error) {
	work, err := os.MkdirTemp(dir, "tampered-")
	if err != nil {
		return "", err
	}
	if out, err := exec.Command("tar", "-xzf", tgz, "-C", work).CombinedOutput(); err != nil {
		return "", fmt.Errorf("tar: %w: %s", err, out)
	}
	f, err := os.OpenFile(filepath.Join(work, "meshlet", "values.yaml"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return "", err
	}
	if _, err := f.WriteString("# not the release's\n"); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	out := filepath.Join(work, filepath.Base(tgz))
	if b, err := exec.Command("tar", "-czf", out, "-C", work, "meshlet").CombinedOutput(); err != nil {
		return "", fmt.Errorf("tar: %w: %s", err, b)
	}
	return out, nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
