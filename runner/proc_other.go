//go:build !linux

package runner

import (
	"errors"
	"os"
	"time"
)

// errNotLinux is every process operation off Linux: nether runs its
// guests on Linux only, and nexus there only drives remote runners.
var errNotLinux = errors.New("runner: nether runs on Linux only")

// Spawn fails off Linux.
func Spawn(nether, dir string, env []string, extra *os.File) (Proc, error) {
	return Proc{}, errNotLinux
}

func secretsFile(b []byte) (*os.File, error) { return nil, errNotLinux }

// Alive is false off Linux: no nether runs here.
func Alive(p Proc) bool { return false }

// Terminate does nothing off Linux.
func Terminate(p Proc, grace time.Duration) {}

// NethersUnder finds none off Linux.
func NethersUnder(root string) map[Proc]string { return map[Proc]string{} }
