package api

import (
	"fmt"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
)

// Every answer any test of this package gets is recorded by route and
// status (seenStatuses), and TestMain checks, once all have run, that
// openapi.yaml lists each status under its route: the document is checked
// against what the server really answers, for every route the tests reach.

var (
	seenMu       sync.Mutex
	seenStatuses = map[string]map[int]bool{} // "POST /v1/sandboxes" -> statuses
)

// routePatterns finds which route a request is for, as the server's mux
// would, without serving it.
var routePatterns = func() *http.ServeMux {
	m := http.NewServeMux()
	for _, rt := range routes {
		m.HandleFunc(rt.method+" "+rt.path, func(http.ResponseWriter, *http.Request) {})
	}
	return m
}()

// recording wraps the handler under test.
func recording(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, pattern := routePatterns.Handler(r)
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		if pattern == "" {
			return // no route: the mux's own 404 and 405
		}
		status := sw.status
		if status == 0 {
			status = http.StatusOK
		}
		seenMu.Lock()
		if seenStatuses[pattern] == nil {
			seenStatuses[pattern] = map[int]bool{}
		}
		seenStatuses[pattern][status] = true
		seenMu.Unlock()
	})
}

// documentedStatuses reads each operation's response codes from the
// document: "METHOD /path" -> statuses.
func documentedStatuses() map[string]map[int]bool {
	doc := map[string]map[int]bool{}
	codeRE := regexp.MustCompile(`^        '(\d{3})':`)
	walkPaths(nil, func(op string) { doc[op] = map[int]bool{} }, func(op, l string) {
		if m := codeRE.FindStringSubmatch(l); m != nil {
			var code int
			fmt.Sscan(m[1], &code)
			doc[op][code] = true
		}
	})
	return doc
}

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 && !testing.Short() && len(seenStatuses) > 0 {
		doc := documentedStatuses()
		var missing []string
		for op, statuses := range seenStatuses {
			for s := range statuses {
				if !doc[op][s] {
					missing = append(missing, fmt.Sprintf("%s answered %d", op, s))
				}
			}
		}
		sort.Strings(missing)
		if len(missing) > 0 {
			fmt.Fprintf(os.Stderr, "FAIL: openapi.yaml does not list statuses the server answered:\n  %s\n", strings.Join(missing, "\n  "))
			code = 1
		}
	}
	os.Exit(code)
}

// TestDocumentedStatusesRead: the reader above finds each operation's
// codes (a reader that found none would make TestMain's check vacuous).
func TestDocumentedStatusesRead(t *testing.T) {
	doc := documentedStatuses()
	if len(doc) != len(routes) {
		t.Fatalf("read %d operations' statuses, want one for each of %d routes", len(doc), len(routes))
	}
	for op, codes := range doc {
		if len(codes) == 0 {
			t.Errorf("%s: no status codes read", op)
		}
	}
	if !doc["GET /v1/sandboxes/{ref}/files"][413] || !doc["POST /v1/sandboxes"][201] {
		t.Fatalf("the reader missed codes: %v", doc)
	}
}
