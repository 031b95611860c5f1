package clustermesh

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CRDName is the ClusterMesh CustomResourceDefinition, meshlet's
// (manifests/crds) or kilo-clustermesh-operator's.
const CRDName = "clustermeshes.kilo.squat.ai"

// Schema is the part of a CRD's structural OpenAPI v3 schema that decides
// which fields the API server keeps: it prunes every field its schema does
// not declare from an update, and refuses a server-side apply that sets one,
// unless x-kubernetes-preserve-unknown-fields says to keep them. The status
// writer writes only what the installed CRD keeps, so that its applies are
// accepted and what it wrote is what it reads back (no write at every pass),
// and says in the log what that is.
type Schema struct {
	Type       string             `json:"type,omitempty"`
	Properties map[string]*Schema `json:"properties,omitempty"`
	Items      *Schema            `json:"items,omitempty"`
	// AdditionalProperties is the schema of every key of a map (a
	// structural schema has it or Properties, not both); true is read as
	// PreserveUnknownFields.
	AdditionalProperties *Schema `json:"-"`
	PreserveUnknown      bool    `json:"x-kubernetes-preserve-unknown-fields,omitempty"`
}

// UnmarshalJSON reads additionalProperties, a schema or a boolean.
func (s *Schema) UnmarshalJSON(b []byte) error {
	type plain Schema
	var aux struct {
		*plain
		AdditionalProperties json.RawMessage `json:"additionalProperties"`
	}
	aux.plain = (*plain)(s)
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	switch ap := strings.TrimSpace(string(aux.AdditionalProperties)); ap {
	case "", "null", "false":
	case "true":
		s.PreserveUnknown = true
	default:
		s.AdditionalProperties = new(Schema)
		if err := json.Unmarshal(aux.AdditionalProperties, s.AdditionalProperties); err != nil {
			return fmt.Errorf("additionalProperties: %w", err)
		}
	}
	return nil
}

// KeepAll is the schema that keeps everything (x-kubernetes-preserve-
// unknown-fields at the top).
var KeepAll = &Schema{Type: "object", PreserveUnknown: true}

// CommonStatus keeps the status fields every ClusterMesh CRD has, meshlet's
// and kilo-clustermesh-operator's: per remote cluster name,
// registeredPeers and skippedNodes, and the conditions. The writer uses it
// when it cannot read the installed CRD.
var CommonStatus = &Schema{Type: "object", Properties: map[string]*Schema{
	"clusters": {Type: "array", Items: &Schema{Type: "object", Properties: map[string]*Schema{
		"name": {Type: "string"}, "registeredPeers": {Type: "integer"}, "skippedNodes": {Type: "integer"},
	}}},
	"conditions": {Type: "array", Items: &Schema{Type: "object", Properties: map[string]*Schema{
		"type": {Type: "string"}, "status": {Type: "string"}, "observedGeneration": {Type: "integer"},
		"lastTransitionTime": {Type: "string"}, "reason": {Type: "string"}, "message": {Type: "string"},
	}}},
}}

// StatusSchema finds the schema of status of version v1alpha1 in a
// CustomResourceDefinition (JSON, apiextensions.k8s.io/v1): the walk down
// openAPIV3Schema.properties.status. A top level that preserves unknown
// fields and declares no status keeps all of it (KeepAll); one that does
// not keeps none of it (an object without properties).
func StatusSchema(crd []byte) (*Schema, error) {
	var doc struct {
		Spec struct {
			Versions []struct {
				Name   string `json:"name"`
				Schema *struct {
					OpenAPIV3Schema *Schema `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(crd, &doc); err != nil {
		return nil, fmt.Errorf("decoding the CRD: %w", err)
	}
	for _, v := range doc.Spec.Versions {
		if v.Name != SchemeGroupVersion.Version {
			continue
		}
		if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
			return nil, fmt.Errorf("version %s has no openAPIV3Schema", v.Name)
		}
		root := v.Schema.OpenAPIV3Schema
		if st := root.Properties["status"]; st != nil {
			return st, nil
		}
		if root.PreserveUnknown {
			return KeepAll, nil
		}
		return &Schema{Type: "object"}, nil
	}
	return nil, fmt.Errorf("no version %s", SchemeGroupVersion.Version)
}

// Prune returns v (a JSON value: maps, slices, scalars) without what s does
// not declare, as the API server prunes it: an object keeps its declared
// properties (pruned by their schemas), every key under
// additionalProperties, and its other keys only where unknown fields are
// preserved; an array prunes each item by items. A nil schema keeps v.
func Prune(v any, s *Schema) any {
	if s == nil {
		return v
	}
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			switch {
			case s.Properties[k] != nil:
				out[k] = Prune(e, s.Properties[k])
			case s.AdditionalProperties != nil:
				out[k] = Prune(e, s.AdditionalProperties)
			case s.PreserveUnknown:
				out[k] = e
			}
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = Prune(e, s.Items)
		}
		return out
	default:
		return v
	}
}

// ProjectStatus is st as the installed CRD (schema s of status) keeps it: a
// JSON object, to apply and to compare with what was read back.
func ProjectStatus(st ClusterMeshStatus, s *Schema) (map[string]any, error) {
	b, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	out, _ := Prune(m, s).(map[string]any)
	return out, nil
}

// KeptFields lists the fields of ClusterMeshStatus that schema s keeps, as
// sorted paths ("clusters[].nodes"): what the writer writes, for its log.
func KeptFields(s *Schema) []string {
	full := ClusterMeshStatus{ReadyClusters: "-", Clusters: []ClusterStatus{{Name: "-", Message: "-"}},
		Conditions: []metav1.Condition{{Type: "-", Status: "-", ObservedGeneration: 1, LastTransitionTime: metav1.Unix(1, 0), Reason: "-", Message: "-"}}}
	m, err := ProjectStatus(full, s)
	if err != nil {
		return nil
	}
	var out []string
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if path != "" {
					k = path + "." + k
				}
				walk(k, e)
			}
		case []any:
			for _, e := range x {
				walk(path+"[]", e)
			}
		default:
			out = append(out, path)
		}
	}
	walk("", m)
	slices.Sort(out)
	return out
}
