package runner

import "github.com/nethersandbox/nether/internal/conf"

// The layout of a launch directory: the names nether reads and writes
// there, which a platform needs to find them.
const (
	// ConfFile holds the sandbox's settings (Settings.Text).
	ConfFile = conf.FileName
	// ControlSocket is nether's control socket.
	ControlSocket = "ctl.sock"
	// DataSocket is the data plane's listener, with app_port.
	DataSocket = "data.sock"
	// Stdout collects nether's standard output: each session's final
	// usage record, appended.
	Stdout = "nether.out"
	// Stderr collects nether's log, appended.
	Stderr = "nether.log"
	// ConsoleLog is the guest's console.
	ConsoleLog = "console.log"
	// ForkDisk is the copy-on-write layer a restore makes over its
	// artifact's disk when nether.conf names no disk
	// (internal/session.ForkDiskLayer).
	ForkDisk = "disk.qcow2"
)

// ArtifactMeta is the file in an artifact (a snapshot or park directory)
// that records every other file's length and checksums; its commit
// marker vouches for it, so its digest pins the whole artifact.
const ArtifactMeta = "meta.json"

// MaxSocketPath is the longest Unix socket path (sun_path): a launch
// directory deeper than this less len(ControlSocket)+1 cannot run nether.
const MaxSocketPath = conf.MaxSocketPath

// RootfsBusybox is the root image setting for none: the initramfs's
// busybox is the whole userland.
const RootfsBusybox = conf.RootfsBusybox
