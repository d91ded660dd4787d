package nexus

import (
	"testing"

	"github.com/nethersandbox/nether/runner"
)

// TestRefusalKinds: each of nether's and the agent's refusals, in their own
// words, reaches a caller as the kind a REST client and the CLI's exit
// codes expect; nexus's own failures stay internal.
func TestRefusalKinds(t *testing.T) {
	sb := &Sandbox{ID: "01JKINDKINDKINDKINDKINDKIN", Name: "web"}
	for _, tc := range []struct {
		verb, msg string
		transfer  bool
		want      string
	}{
		{"exec", "ERR read-only observer: exec needs the primary client", false, KindBusy},
		{"snapshot", "ERR snapshot: guest not quiescent: channel: 1 streams open (set snapshot_allow_dirty=1 to capture anyway)", false, KindBusy},
		{"park", "ERR park: undelivered bytes: plane: 12 bytes held (set park_dirty=1 to park anyway and lose them)", false, KindBusy},
		{"claim", "ERR claim: a snapshot or park is in progress; claim once it has ended", false, KindBusy},
		{"exec", "ERR agent not connected (guest not ready)", false, KindInternal},
		{"get", "ERR get: opening /tmp/none: no such file or directory", true, KindNotFound},
		{"get", "ERR get: /etc: not a regular file", true, KindBadInput},
		{"put", "ERR put: /dev/null: not a regular file; refusing to replace it", true, KindBadInput},
		{"get", "ERR get: opening /root/x: permission denied", true, KindRefused},
		{"get", "ERR get: over the transfer limit of 1024 bytes", true, KindTooLarge},
		{"get", "ERR get: transfer cancelled: transfer stalled: no progress for 30s", true, KindInternal},
	} {
		t.Run(tc.msg, func(t *testing.T) {
			err := verbError(sb, runner.Refusal(tc.verb, tc.msg))
			if tc.transfer {
				err = transferError(err)
			}
			if got := Kind(err); got != tc.want {
				t.Fatalf("%q: kind %q (%v), want %q", tc.msg, got, err, tc.want)
			}
		})
	}
	if err := checkGuestPath("/tmp/a b"); Kind(err) != KindBadInput {
		t.Errorf("a guest path with a blank: %v", err)
	}
	if err := checkGuestPath("/tmp/ok"); err != nil {
		t.Errorf("a plain guest path: %v", err)
	}
}
