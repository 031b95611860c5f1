package apiserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// ApplyOptions tunes Apply.
type ApplyOptions struct {
	// DryRun asks the server to validate and admit every object without
	// persisting it (server-side dry-run).
	DryRun bool
	// FieldManager of the server-side apply (default "meshlet-test").
	FieldManager string
	// Namespace for namespaced objects that name none (default "default").
	Namespace string
	// Timeout bounds waiting for a CRD to be established and for its kind
	// to appear in discovery (default 30 s).
	Timeout time.Duration
}

// DecodeYAML splits a multi-document YAML (or JSON) stream into objects,
// skipping empty documents and expanding v1 Lists.
func DecodeYAML(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.IsList() {
			l, err := u.ToList()
			if err != nil {
				return nil, err
			}
			for i := range l.Items {
				objs = append(objs, &l.Items[i])
			}
			continue
		}
		objs = append(objs, u)
	}
}

// ApplyFile is Apply on the content of a file.
func ApplyFile(ctx context.Context, cfg *rest.Config, path string, opts ApplyOptions) ([]*unstructured.Unstructured, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Apply(ctx, cfg, b, opts)
}

// Apply server-side applies every object of a multi-document YAML in order,
// with the dynamic client and a discovery-backed RESTMapper. A
// CustomResourceDefinition is waited for (Established) before the next
// document, so a file may hold CRDs followed by objects of their kinds
// (not in dry-run, where the CRD is not created). It applies all objects and
// returns the applied objects (as the server returned them) and one error per
// failed object, joined.
func Apply(ctx context.Context, cfg *rest.Config, data []byte, opts ApplyOptions) ([]*unstructured.Unstructured, error) {
	objs, err := DecodeYAML(data)
	if err != nil {
		return nil, err
	}
	return ApplyObjects(ctx, cfg, objs, opts)
}

// ApplyObjects is Apply on decoded objects.
func ApplyObjects(ctx context.Context, cfg *rest.Config, objs []*unstructured.Unstructured, opts ApplyOptions) ([]*unstructured.Unstructured, error) {
	if opts.FieldManager == "" {
		opts.FieldManager = "meshlet-test"
	}
	if opts.Namespace == "" {
		opts.Namespace = "default"
	}
	if opts.Timeout == 0 {
		opts.Timeout = 30 * time.Second
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	var errs []error
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		id := fmt.Sprintf("%s %s", gvk.Kind, obj.GetName())
		if obj.GetNamespace() != "" {
			id = fmt.Sprintf("%s %s/%s", gvk.Kind, obj.GetNamespace(), obj.GetName())
		}
		mapping, err := restMapping(ctx, mapper, gvk, opts.Timeout)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", id, err))
			continue
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := obj.GetNamespace()
			if ns == "" {
				ns = opts.Namespace
			}
			ri = dyn.Resource(mapping.Resource).Namespace(ns)
		}
		ao := metav1.ApplyOptions{FieldManager: opts.FieldManager, Force: true}
		if opts.DryRun {
			ao.DryRun = []string{metav1.DryRunAll}
		}
		got, err := ri.Apply(ctx, obj.GetName(), obj, ao)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", id, err))
			continue
		}
		out = append(out, got)
		if gvk.Group == "apiextensions.k8s.io" && gvk.Kind == "CustomResourceDefinition" && !opts.DryRun {
			if err := waitEstablished(ctx, dyn.Resource(mapping.Resource), obj.GetName(), opts.Timeout); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", id, err))
			}
			mapper.Reset()
		}
	}
	return out, errors.Join(errs...)
}

// restMapping resolves gvk, refreshing discovery while the kind is unknown:
// a CRD's kind appears in discovery shortly after it is established.
func restMapping(ctx context.Context, mapper *restmapper.DeferredDiscoveryRESTMapper, gvk schema.GroupVersionKind, timeout time.Duration) (*meta.RESTMapping, error) {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err == nil {
			return m, nil
		}
		if !meta.IsNoMatchError(err) || time.Now().After(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
		mapper.Reset()
	}
}

func waitEstablished(ctx context.Context, crds dynamic.NamespaceableResourceInterface, name string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		crd, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("CRD %s not established within %s (last error: %v)", name, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
