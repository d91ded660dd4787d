package api

import (
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/nexus"
)

// There is no YAML parser in go.mod, and the document is written for
// people; these tests read the few things they check from its text, which
// its regular indentation (two spaces a level) makes unambiguous.

// walkPaths calls op for each operation under paths: as it starts
// ("METHOD /path"), and line for each line inside it.
func walkPaths(t *testing.T, op func(string), line func(op, l string)) {
	inPaths, path, cur := false, "", ""
	pathRE := regexp.MustCompile(`^  (/\S*):\s*$`)
	opRE := regexp.MustCompile(`^    (get|put|post|delete|patch|head|options|trace):\s*$`)
	for _, l := range strings.Split(string(OpenAPI), "\n") {
		if l != "" && l[0] != ' ' {
			inPaths = strings.HasPrefix(l, "paths:")
			continue
		}
		if !inPaths {
			continue
		}
		if m := pathRE.FindStringSubmatch(l); m != nil {
			path, cur = m[1], ""
		} else if m := opRE.FindStringSubmatch(l); m != nil {
			if path == "" && t != nil {
				t.Fatalf("openapi.yaml: %q before any path", l)
			}
			cur = strings.ToUpper(m[1]) + " " + path
			op(cur)
		} else if cur != "" && line != nil {
			line(cur, l)
		}
	}
}

// openapiOps is every "METHOD /path" under paths:.
func openapiOps(t *testing.T) []string {
	t.Helper()
	var ops []string
	walkPaths(t, func(op string) { ops = append(ops, op) }, nil)
	return ops
}

// TestOpenAPIMatchesRoutes: every route the server registers is in the
// document, and the document describes no route the server lacks.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	doc := openapiOps(t)
	if len(doc) == 0 {
		t.Fatal("openapi.yaml: no operations found under paths:")
	}
	var served []string
	for _, rt := range routes {
		served = append(served, rt.method+" "+rt.path)
	}
	for _, op := range served {
		if !slices.Contains(doc, op) {
			t.Errorf("the server serves %s, which openapi.yaml does not describe", op)
		}
	}
	for _, op := range doc {
		if !slices.Contains(served, op) {
			t.Errorf("openapi.yaml describes %s, which the server does not serve", op)
		}
	}
	seen := map[string]bool{}
	for _, op := range doc {
		if seen[op] {
			t.Errorf("openapi.yaml describes %s twice", op)
		}
		seen[op] = true
	}
}

// TestOpenAPIRefsResolve: every $ref names a component the document
// defines.
func TestOpenAPIRefsResolve(t *testing.T) {
	defined := map[string]bool{}
	section, inComponents := "", false
	secRE := regexp.MustCompile(`^  (\w+):\s*$`)
	nameRE := regexp.MustCompile(`^    (\w+):\s*$`)
	for _, l := range strings.Split(string(OpenAPI), "\n") {
		if l != "" && l[0] != ' ' {
			inComponents = strings.HasPrefix(l, "components:")
			continue
		}
		if !inComponents {
			continue
		}
		if m := secRE.FindStringSubmatch(l); m != nil {
			section = m[1]
		} else if m := nameRE.FindStringSubmatch(l); m != nil {
			defined[section+"/"+m[1]] = true
		}
	}
	refs := regexp.MustCompile(`\$ref: '#/components/(\w+/\w+)'`).FindAllStringSubmatch(string(OpenAPI), -1)
	if len(refs) == 0 {
		t.Fatal("no $ref found")
	}
	for _, m := range refs {
		if !defined[m[1]] {
			t.Errorf("$ref #/components/%s: not defined (defined: %d components)", m[1], len(defined))
		}
	}
	if strings.Contains(string(OpenAPI), "$ref: \"") || strings.Contains(string(OpenAPI), "$ref: #") {
		t.Error("a $ref spelled otherwise than '#/components/...' escapes this check")
	}
}

// TestOpenAPIKinds: the document's table of error kinds gives each kind
// the server answers the status it answers with, and the Error schema's
// enum lists them all.
func TestOpenAPIKinds(t *testing.T) {
	kinds := []string{nexus.KindIllegal, nexus.KindBusy, nexus.KindNameTaken, kindInUse, nexus.KindNotFound,
		nexus.KindBadInput, kindForbidden, nexus.KindRefused, nexus.KindTooLarge, kindMethod, nexus.KindInternal}
	enum := regexp.MustCompile(`(?m)^\s+enum: \[(illegal_transition[^\]]*)\]`).FindStringSubmatch(string(OpenAPI))
	if enum == nil {
		t.Fatal("openapi.yaml: the Error schema's kind enum is not found")
	}
	listed := strings.Split(strings.ReplaceAll(enum[1], " ", ""), ",")
	slices.Sort(listed)
	want := slices.Clone(kinds)
	slices.Sort(want)
	if !slices.Equal(listed, want) {
		t.Errorf("the kind enum is %v, want %v", listed, want)
	}
	for _, k := range kinds {
		m := regexp.MustCompile(`\|\s*` + k + `\s*\|\s*(\d+)\s*\|`).FindStringSubmatch(string(OpenAPI))
		if m == nil {
			t.Errorf("the kinds table has no row for %s", k)
			continue
		}
		if got, _ := strconv.Atoi(m[1]); got != statusOf(k) {
			t.Errorf("the kinds table says %s is %d; the server answers %d", k, got, statusOf(k))
		}
	}
	if s := fmt.Sprint(statusOf("no such kind")); s != "500" {
		t.Errorf("an unknown kind answers %s, want 500", s)
	}
}

// schemaProps is the property names of components/schemas/<name> (its
// own properties, and those of an inline object in its allOf).
func schemaProps(t *testing.T, name string) []string {
	t.Helper()
	var props []string
	in, inProps := false, false
	for _, l := range strings.Split(string(OpenAPI), "\n") {
		switch {
		case l == "    "+name+":":
			in = true
			continue
		case in && strings.HasPrefix(l, "    ") && !strings.HasPrefix(l, "     "):
			in = false // the next schema
		}
		if !in {
			continue
		}
		trimmed := strings.TrimLeft(l, " ")
		indent := len(l) - len(trimmed)
		if trimmed == "properties:" {
			inProps = true
			continue
		}
		if m := regexp.MustCompile(`^(\w+):`).FindStringSubmatch(trimmed); inProps && m != nil && (indent == 8 || indent == 12) {
			props = append(props, m[1])
		}
	}
	if len(props) == 0 {
		t.Fatalf("openapi.yaml: schema %s has no properties", name)
	}
	return props
}

// jsonFields is the JSON names of a struct's fields, embedded ones
// flattened as encoding/json does.
func jsonFields(t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			out = append(out, jsonFields(f.Type)...)
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	return out
}

// TestOpenAPISchemasMatchBodies: the request and record schemas name
// exactly the JSON fields the server reads and writes, so a setting added
// to nexus.Config (rootfs, run_as, disk_size_mb, ...) or to a body cannot
// go undocumented.
func TestOpenAPISchemasMatchBodies(t *testing.T) {
	for _, tc := range []struct {
		schema string
		typ    reflect.Type
		extra  []string // the schema's allOf parts documented elsewhere
	}{
		{"Config", reflect.TypeOf(nexus.Config{}), nil},
		{"CreateRequest", reflect.TypeOf(createBody{}), jsonFields(reflect.TypeOf(nexus.Config{}))},
		{"Sandbox", reflect.TypeOf(nexus.Sandbox{}), nil},
		{"Snapshot", reflect.TypeOf(nexus.Snapshot{}), nil},
		{"ForkRequest", reflect.TypeOf(forkBody{}), nil},
	} {
		t.Run(tc.schema, func(t *testing.T) {
			doc := append(schemaProps(t, tc.schema), tc.extra...)
			fields := jsonFields(tc.typ)
			slices.Sort(doc)
			slices.Sort(fields)
			if !slices.Equal(slices.Compact(doc), slices.Compact(fields)) {
				t.Errorf("openapi.yaml's %s has %v; the Go type has %v", tc.schema, doc, fields)
			}
		})
	}
}
