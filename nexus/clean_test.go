package nexus

import (
	"strings"
	"testing"

	"github.com/nethersandbox/nether/nexus/trust"
)

func TestCleanRefusal(t *testing.T) {
	quiet := map[string]int64{"net_tx": 0, "net_rx": 0, "data_conns": 0}
	cases := []struct {
		name  string
		sb    Sandbox
		plan  *trust.Plan
		stats map[string]int64
		want  string // "" clean
	}{
		{"nothing of a tenant's", Sandbox{}, nil, quiet, ""},
		{"an admitted sandbox without grants", Sandbox{}, &trust.Plan{Grants: trust.Grants{MaxDescendants: 4}}, quiet, ""},
		{"secrets delivered unadmitted", Sandbox{Secrets: []string{"DB", "KEY"}}, nil, quiet, "it holds secrets (DB, KEY)"},
		{"secrets in its plan", Sandbox{}, &trust.Plan{Secrets: []string{"API_KEY"}}, quiet, "its plan hands it secrets (API_KEY)"},
		{"a plane granted", Sandbox{}, &trust.Plan{Grants: trust.Grants{Egress: true}}, quiet, "its plan grants it a data or egress plane"},
		{"an app port", Sandbox{Config: Config{AppPort: 8080}}, nil, quiet, "app_port"},
		{"traffic on its NIC", Sandbox{}, nil, map[string]int64{"net_tx": 60, "net_rx": 0}, "its network card carried traffic (net_tx=60 net_rx=0)"},
		{"data connections", Sandbox{}, nil, map[string]int64{"data_conns": 2}, "it served 2 data or egress connections"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := cleanRefusal(&c.sb, c.plan, c.stats)
			if c.want == "" && got != "" || !strings.Contains(got, c.want) {
				t.Fatalf("cleanRefusal = %q, want %q", got, c.want)
			}
		})
	}
}
