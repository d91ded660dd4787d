// Package runner drives one nether process: it owns the launch directory
// a sandbox's nether runs in (its layout, below), writes the sandbox's
// typed settings as nether.conf through nether's one canonical writer,
// spawns nether detached there with its inherited descriptors, tells
// whether it still runs and ends it, and speaks its control protocol as
// typed verbs with typed replies.
//
// nexus drives every sandbox through the Runner interface; Local is the
// real one (nether processes on this host), and a test or another
// orchestrator may bring its own (runner/fakerunner simulates sandboxes
// in memory). A platform written in Go may use this package directly to
// run nether without nexus.
package runner

import (
	"context"
	"io"
	"time"
)

// Proc names one nether process for good: its pid and the start time the
// kernel gave it (a pid alone may be reused).
type Proc struct {
	PID   int
	Start uint64
}

// Runner is what an orchestrator needs of the processes that run its
// sandboxes. dir is always a sandbox's launch directory.
type Runner interface {
	// Launch writes dir's nether.conf from s and starts nether there,
	// detached; secrets (nil = none) reach it through an inherited
	// descriptor, never a file. It returns once the process exists; the
	// guest comes up later (Dial, Info().AgentConnected()).
	Launch(dir string, s Settings, secrets map[string][]byte) (Proc, error)
	// Alive says whether p still runs (a zombie does not).
	Alive(p Proc) bool
	// Terminate ends p: SIGTERM (it settles and prints its final record),
	// then SIGKILL after grace.
	Terminate(p Proc, grace time.Duration)
	// Running lists the live nethers whose launch directory is right
	// under root, found without any record, so an orphan is found too.
	Running(root string) map[Proc]string
	// Dial connects to the control socket of the nether in dir.
	Dial(ctx context.Context, dir string) (Conn, error)
	// Mark is where dir's outputs end now: what a later launch prints
	// comes after it.
	Mark(dir string) Mark
	// Final is the last final usage record nether printed in dir from
	// mark on ("" if none).
	Final(dir string, from Mark) string
	// Why is the last error nether logged in dir from mark on, or where
	// to look.
	Why(dir string, from Mark) string
	// BootImage is the kernel and root image a boot with these settings
	// runs, digested as nether digests them for its fingerprint.
	BootImage(gpu bool, rootfs string) (Image, error)
	// Artifact reads what the snapshot or park at dir holds.
	Artifact(dir string) (Artifact, error)
}

// Conn is one connection to a nether's control socket, with the verbs
// an orchestrator uses. A refusal is a *ReplyError.
type Conn interface {
	// Info is the handshake's __info__ report.
	Info() Info
	Stats(ctx context.Context) (Stats, error)
	// Snapshot captures a base at rel (inside the launch directory); the
	// sandbox keeps running.
	Snapshot(ctx context.Context, rel string) (Capture, error)
	// Park captures a one-shot park at rel and ends the session.
	Park(ctx context.Context, rel string) (Parked, error)
	// Claim gives a pool member the identity asked for.
	Claim(ctx context.Context, r ClaimRequest) error
	// Put copies the launch directory's file hostRel to guestPath; Get
	// the other way.
	Put(ctx context.Context, hostRel, guestPath string) error
	Get(ctx context.Context, guestPath, hostRel string) error
	// Shutdown asks for a clean teardown; the process then exits.
	Shutdown(ctx context.Context) error
	// Exec runs a guest shell line (never a control verb), streaming its
	// output to out, and returns its exit code.
	Exec(ctx context.Context, line string, out io.Writer) (int, error)
	Close() error
}

// Image is what a boot runs: the kernel's and the root image's digests,
// "" where it cannot be told.
type Image struct{ Kernel, Rootfs string }

// Artifact is what a snapshot or park holds, from its fingerprint.
type Artifact struct {
	Kind           string // "base" or "park"
	CPUs, RAMMB    int
	Kernel, Rootfs string // digests
}
