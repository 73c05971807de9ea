package inject

import (
	"encoding/json"
	"strconv"
	"strings"
)

// Operation is one RFC 6902 JSON patch operation.
type Operation struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// Patch is an RFC 6902 JSON patch, applied in order.
type Patch []Operation

// MarshalJSON encodes an empty patch as [] rather than null.
func (p Patch) MarshalJSON() ([]byte, error) {
	if p == nil {
		return []byte("[]"), nil
	}
	return json.Marshal([]Operation(p))
}

func (p *Patch) add(path string, value any) {
	*p = append(*p, Operation{Op: "add", Path: path, Value: value})
}

func (p *Patch) replace(path string, value any) {
	*p = append(*p, Operation{Op: "replace", Path: path, Value: value})
}

func (p *Patch) remove(path string) {
	*p = append(*p, Operation{Op: "remove", Path: path})
}

// pointer joins reference tokens into a JSON pointer (RFC 6901), escaping
// "~" and "/" in each token (annotation keys contain "/").
func pointer(tokens ...string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		t = strings.ReplaceAll(t, "~", "~0")
		b.WriteString(strings.ReplaceAll(t, "/", "~1"))
	}
	return b.String()
}

func index(i int) string { return strconv.Itoa(i) }
