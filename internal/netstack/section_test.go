package netstack

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/internal/snapshot"
)

// The section's name, version and bytes are part of the artifact format:
// artifacts written before must restore, and these are what they hold.
func TestSectionFormat(t *testing.T) {
	c := NewComponent(nil, nil)
	if c.Name() != "net" || c.Version() != 2 || c.Required() {
		t.Fatalf("section %q version %d required %v, want net 2 false", c.Name(), c.Version(), c.Required())
	}
	for _, tc := range []struct {
		name string
		sec  any
		want string
	}{
		{"no network", mustSave(t, c), `{"conns":null}`},
		{"conns and mac", section{Conns: []GuestConn{{SndNxt: 7}}, MAC: "02:00:00:00:00:01"},
			`{"conns":[{"local":"","remote":"","snd_nxt":7,"rcv_nxt":0}],"mac":"02:00:00:00:00:01"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.sec)
			if err != nil || string(b) != tc.want {
				t.Fatalf("%s (%v), want %s", b, err, tc.want)
			}
		})
	}
}

func mustSave(t *testing.T, c *Component) json.RawMessage {
	t.Helper()
	b, err := c.Save(snapshot.KindBase)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSectionRestoreRefuses(t *testing.T) {
	many := `{"conns":[` + strings.Repeat(`{},`, sectionMaxConns) + `{}]}`
	for _, tc := range []struct{ name, data, err string }{
		{"absent", "", ""},
		{"empty", `{"conns":null}`, ""},
		{"mac without a stack", `{"conns":[],"mac":"02:00:00:00:00:01"}`, ""},
		{"not json", `[`, "net section"},
		{"too many conns", many, "over 4096"},
		{"bad mac", `{"conns":[],"mac":"02:00:00:00:00"}`, "not an Ethernet address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var data json.RawMessage
			if tc.data != "" {
				data = json.RawMessage(tc.data)
			}
			err := NewComponent(nil, nil).Restore(2, data)
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("err = %v, want %q", err, tc.err)
			}
		})
	}
}
