package session

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/engine/fake"
	"github.com/nethersandbox/nether/internal/meter"
)

// TestUnusableDiskEnds: a guest that could not mount its persistent disk
// ends the sandbox at once with reason=error and exit status 1, rather
// than run on refusing every command: the command that waited for the
// agent is refused naming the disk's host file and what is wrong with it,
// and nether's log says the same.
func TestUnusableDiskEnds(t *testing.T) {
	eng := fake.New(slog.Default())
	const problem = "is not a usable ext4 file system: the guest's kernel would not mount it (invalid argument): EXT4-fs (vdb): Invalid log block size: 4022250974"
	// The hello comes late enough for the client to be connected when
	// the sandbox ends on it (an instant one ended it before the dial).
	eng.SetFaults(fake.Faults{DiskProblem: problem, HelloAfter: time.Second})
	sb := start(t, eng, "", "disk = data.img\n")
	c := sb.dial()
	began := time.Now()
	_, exit, err := run(t, c, "echo hi")
	want := "the disk " + filepath.Join(sb.dir, "data.img") + " " + problem
	if err == nil || exit != -1 || !strings.Contains(err.Error(), want) {
		t.Fatalf("a command on a guest that could not mount its disk: exit %d, err %v; want an ERR with %q", exit, err, want)
	}
	sb.expectEnd(5*time.Second, 1, meter.ReasonError)
	t.Logf("refused and ended %s after the command was sent", time.Since(began).Round(time.Millisecond))
	if logs := sb.logs.String(); !strings.Contains(logs, "level=ERROR") || !strings.Contains(logs, want) {
		t.Errorf("nether's log does not name the disk and its fault:\n%s", logs)
	}
}
