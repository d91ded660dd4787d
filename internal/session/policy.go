package session

import (
	"encoding/json"
	"fmt"

	"github.com/nethersandbox/nether/internal/snapshot"
)

// The run_as policy is the guest's (its agent holds it), so a fork
// inherits its base's; this section records it in the artifact so that a
// restore which would widen it is refused before anything starts, by name.

const policyComponentName = "policy"

type policySection struct {
	RunAs string `json:"run_as,omitempty"` // "" = root
}

// policyComponent is made with the policy the guest runs under ("" =
// root, and for validation).
type policyComponent struct {
	runAs string
}

func (c *policyComponent) Name() string     { return policyComponentName }
func (c *policyComponent) Version() int     { return 1 }
func (c *policyComponent) Required() bool   { return false }
func (c *policyComponent) Quiescent() error { return nil }
func (c *policyComponent) Freeze()          {}
func (c *policyComponent) Thaw()            {}

func (c *policyComponent) Save(snapshot.Kind) (json.RawMessage, error) {
	return json.Marshal(policySection{RunAs: c.runAs})
}

func (c *policyComponent) Restore(version int, data json.RawMessage) error {
	if data == nil {
		return nil
	}
	var sec policySection
	return json.Unmarshal(data, &sec)
}

// restoredRunAs is the policy a restore of art runs under, given
// nether.conf's run_as: the captured one, or a narrowing of root to a
// user; a widening or a change is refused.
func restoredRunAs(art *snapshot.Artifact, asked string) (string, error) {
	var sec policySection
	if raw, ok := art.Meta.Sections[policyComponentName]; ok {
		if err := json.Unmarshal(raw.Data, &sec); err != nil {
			return "", fmt.Errorf("the policy section: %w", err)
		}
	}
	switch {
	case asked == "" || asked == sec.RunAs:
		return sec.RunAs, nil
	case sec.RunAs == "":
		return asked, nil
	case asked == "root":
		return "", fmt.Errorf("run_as = root: the snapshot runs commands as %s, and a fork may narrow run_as (root to a user) but never widen it; leave run_as unset to inherit %s", sec.RunAs, sec.RunAs)
	default:
		return "", fmt.Errorf("run_as = %s: the snapshot runs commands as %s, and a fork may narrow run_as (root to a user) but never change it to another user", asked, sec.RunAs)
	}
}
