// Command mkimage assembles meshlet's multi-arch OCI image from files, with
// no Docker engine and no registry: per platform a Debian rootfs layer (a
// tarball hack/image/rootfs.sh made) and a layer holding the static meshlet
// binary, under one OCI image index, written as an OCI image layout packed in
// a tarball (what `ctr images import`, `crane push --index`, `podman load`
// and `skopeo copy oci-archive:` read).
//
// Every timestamp is --created and every layer is gzip at a fixed level, so
// the same inputs give the same digests (hack/image/README.md).
//
//	mkimage --out meshlet.oci.tar --name ghcr.io/meshlet/meshlet:v1 --created 1700000000 \
//	    --platform linux/amd64=rootfs-amd64.tar,meshlet-amd64 \
//	    --platform linux/arm64=rootfs-arm64.tar,meshlet-arm64
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// platformFlag collects --platform os/arch=rootfs.tar,binary.
type platformFlag []platformInput

type platformInput struct {
	platform v1.Platform
	rootfs   string
	binary   string
}

func (p *platformFlag) String() string { return fmt.Sprint(len(*p)) }

func (p *platformFlag) Set(s string) error {
	plat, files, ok := strings.Cut(s, "=")
	rootfs, binary, ok2 := strings.Cut(files, ",")
	osName, arch, ok3 := strings.Cut(plat, "/")
	if !ok || !ok2 || !ok3 || rootfs == "" || binary == "" {
		return fmt.Errorf("want os/arch=rootfs.tar,binary, got %q", s)
	}
	in := platformInput{platform: v1.Platform{OS: osName, Architecture: arch}, rootfs: rootfs, binary: binary}
	if arch == "arm64" {
		// What the registries' arm64 images say; containerd matches
		// linux/arm64 to linux/arm64/v8 either way.
		in.platform.Variant = "v8"
	}
	*p = append(*p, in)
	return nil
}

func main() {
	var plats platformFlag
	out := flag.String("out", "", "OCI image layout tarball to write")
	name := flag.String("name", "ghcr.io/meshlet/meshlet:dev", "image reference recorded in the layout (org.opencontainers.image.ref.name)")
	created := flag.Int64("created", 0, "creation time and every file time, Unix seconds (SOURCE_DATE_EPOCH)")
	version := flag.String("version", "dev", "meshlet version, for the image labels")
	revision := flag.String("revision", "", "source revision, for the image labels")
	flag.Var(&plats, "platform", "os/arch=rootfs.tar,binary (repeat per platform)")
	flag.Parse()
	if *out == "" || len(plats) == 0 {
		fmt.Fprintln(os.Stderr, "mkimage: --out and at least one --platform are required")
		os.Exit(2)
	}
	if err := build(*out, *name, time.Unix(*created, 0).UTC(), *version, *revision, plats); err != nil {
		slog.Error("mkimage failed", "err", err)
		os.Exit(1)
	}
}

func build(out, name string, created time.Time, version, revision string, plats []platformInput) error {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range plats {
		img, err := platformImage(p, created, version, revision)
		if err != nil {
			return fmt.Errorf("%s/%s: %w", p.platform.OS, p.platform.Architecture, err)
		}
		plat := p.platform
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &plat}})
	}
	dir, err := os.MkdirTemp(filepath.Dir(out), ".mkimage-")
	if err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("writing the layout: %w", err)
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": name,
		// containerd's importer names the image by this one.
		"io.containerd.image.name": name,
	})); err != nil {
		return fmt.Errorf("writing the index: %w", err)
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	tmp := out + ".tmp"
	if err := tarDir(dir, tmp, created); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("renaming %s: %w", tmp, err)
	}
	fmt.Printf("%s %s %s\n", out, name, digest)
	return nil
}

func platformImage(p platformInput, created time.Time, version, revision string) (v1.Image, error) {
	base, err := tarball.LayerFromFile(p.rootfs, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.DefaultCompression))
	if err != nil {
		return nil, fmt.Errorf("rootfs layer %s: %w", p.rootfs, err)
	}
	binTar, err := binaryLayer(p.binary, created)
	if err != nil {
		return nil, err
	}
	bin, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(binTar)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.DefaultCompression))
	if err != nil {
		return nil, fmt.Errorf("binary layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "hack/image/rootfs.sh (mmdebstrap: iptables, ca-certificates)"}},
		mutate.Addendum{Layer: bin, History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "COPY meshlet /usr/local/bin/meshlet (CGO_ENABLED=0)"}},
	)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.platform.OS, p.platform.Architecture, p.platform.Variant
	cf.Created = v1.Time{Time: created}
	labels := map[string]string{
		"org.opencontainers.image.title":   "meshlet",
		"org.opencontainers.image.source":  "https://github.com/meshlet/meshlet",
		"org.opencontainers.image.version": version,
		"org.opencontainers.image.created": created.Format(time.RFC3339),
	}
	if revision != "" {
		labels["org.opencontainers.image.revision"] = revision
	}
	cf.Config = v1.Config{
		// Not a shell: there is none in the image.
		Entrypoint: []string{"/usr/local/bin/meshlet"},
		Cmd:        []string{"run"},
		// Root: links, routes and iptables in the host's namespace need
		// CAP_NET_ADMIN in the init user namespace (see the Dockerfile).
		User:   "0:0",
		Env:    []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Labels: labels,
	}
	return mutate.ConfigFile(img, cf)
}

// binaryLayer is a tar holding usr/local/bin/meshlet (0755, root).
func binaryLayer(path string, mtime time.Time) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the binary: %w", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"usr/", "usr/local/", "usr/local/bin/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "usr/local/bin/meshlet", Mode: 0o755, Size: int64(len(b)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(b); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarDir packs the layout directory: sorted names, one mtime, root owner.
func tarDir(dir, out string, mtime time.Time) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			names = append(names, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("walking %s: %w", dir, err)
	}
	sort.Strings(names)
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for _, p := range names {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: mtime, Mode: 0o644, Format: tar.FormatPAX}
		switch {
		case fi.IsDir():
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
		case fi.Mode().IsRegular():
			h.Typeflag, h.Size = tar.TypeReg, fi.Size()
		default:
			return fmt.Errorf("%s: not a file or directory", p)
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if err := copyFile(tw, p); err != nil {
				return err
			}
		}
	}
	return errors.Join(tw.Close(), f.Close())
}

func copyFile(w io.Writer, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}
