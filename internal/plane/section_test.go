package plane

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/nethersandbox/nether/internal/snapshot"
)

// The section's name, version and bytes are part of the artifact format:
// artifacts written before must restore, and these are what they hold.
func TestSectionFormat(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ports Ports
		want  string
	}{
		{"no planes", Ports{}, `{}`},
		{"both ports", Ports{App: 8080, Egress: 9000}, `{"app_port":8080,"egress_port":9000}`},
		{"app only", Ports{App: 8080}, `{"app_port":8080}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewComponent(nil, tc.ports)
			if c.Name() != "planes" || c.Version() != 1 || c.Required() {
				t.Fatalf("section %q version %d required %v, want planes 1 false", c.Name(), c.Version(), c.Required())
			}
			b, err := c.Save(snapshot.KindPark)
			if err != nil || string(b) != tc.want {
				t.Fatalf("%s (%v), want %s", b, err, tc.want)
			}
			got, err := DecodeSection(b)
			if err != nil || got != tc.ports {
				t.Fatalf("decoded %+v (%v), want %+v", got, err, tc.ports)
			}
		})
	}
}

func TestDecodeSectionRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		portRange  bool
	}{
		{"not json", `[`, false},
		{"negative", `{"app_port":-1}`, true},
		{"too big", `{"egress_port":65536}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeSection(json.RawMessage(tc.data))
			if err == nil || errors.Is(err, ErrPortRange) != tc.portRange {
				t.Fatalf("err = %v, want a refusal (port range: %v)", err, tc.portRange)
			}
			if err := NewComponent(nil, Ports{}).Restore(1, json.RawMessage(tc.data)); err == nil {
				t.Fatal("Restore accepted it")
			}
		})
	}
	if err := NewComponent(nil, Ports{}).Restore(1, nil); err != nil {
		t.Fatalf("an artifact without the section: %v", err)
	}
}
