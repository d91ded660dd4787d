package session

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/internal/snapshot"
)

// A restore inherits its artifact's run_as, may narrow root to a user,
// and is refused, naming both users, when it would widen or change it.
func TestRestoredRunAs(t *testing.T) {
	art := func(runAs string) *snapshot.Artifact {
		a := &snapshot.Artifact{Meta: snapshot.Meta{Sections: map[string]snapshot.Section{}}}
		if runAs != "-" {
			data, _ := json.Marshal(policySection{RunAs: runAs})
			a.Meta.Sections[policyComponentName] = snapshot.Section{Version: 1, Data: data}
		}
		return a
	}
	for _, tc := range []struct {
		name, captured, asked, want, err string
	}{
		{"no section, nothing asked", "-", "", "", ""},
		{"root inherits root", "", "", "", ""},
		{"root narrows", "", "nether", "nether", ""},
		{"artifact without a section narrows", "-", "nether", "nether", ""},
		{"user inherits", "nether", "", "nether", ""},
		{"user asked itself", "nether", "nether", "nether", ""},
		{"user widened to root", "nether", "root", "", "never widen it"},
		{"user changed", "nether", "other", "", "never change it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := restoredRunAs(art(tc.captured), tc.asked)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "nether") {
					t.Fatalf("err = %v, want one with %q naming the user", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("= %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
