package agentclient

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/engine/fake"
)

func TestReseed(t *testing.T) {
	seed := bytes.Repeat([]byte{0x00, 0xff, 0x80, 'x'}, 8) // not UTF-8: must arrive byte for byte
	for _, tc := range []struct {
		name   string
		faults fake.Faults
		seed   []byte
		want   string // "" = success
	}{
		{"the agent reseeds", fake.Faults{}, seed, ""},
		{"an agent that predates reseeding", fake.Faults{OldAgent: true}, seed, `reseeding the guest CRNG: unknown agent operation "reseed"`},
		{"a seed the agent refuses", fake.Faults{}, seed[:8], "reseeding the guest CRNG: reseed: a seed of 8 bytes is too short"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, m := boot(t, tc.faults)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := c.WaitUp(ctx); err != nil {
				t.Fatal(err)
			}
			err := c.Reseed(ctx, tc.seed)
			got := m.Reseeds()
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Reseed: %v, want an error with %q", err, tc.want)
				}
				if len(got) != 0 {
					t.Fatalf("a refused reseed was recorded: %q", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || !bytes.Equal(got[0], tc.seed) {
				t.Fatalf("the agent got seeds %q, want [%q]", got, tc.seed)
			}
		})
	}
}
