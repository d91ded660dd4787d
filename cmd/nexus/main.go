// nexus orchestrates nether sandboxes: records that outlive it, a
// lifecycle table, snapshots, forks and warm pools. Each sandbox's nether
// runs detached in its own directory under the state directory.
package main

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/nethersandbox/nether/nexus/trust"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/nethersandbox/nether/internal/conf"
	"github.com/nethersandbox/nether/nexus"
	"github.com/nethersandbox/nether/nexus/lifecycle"
)

// Exit codes.
const (
	exitError   = 1 // anything else
	exitUsage   = 2
	exitIllegal = 3 // the lifecycle table does not allow the request
	exitMissing = 4 // no such sandbox or snapshot
	exitBusy    = 5 // another operation holds the sandbox
	exitTaken   = 6 // the name is taken
	exitRefused = 7 // admission refused it (no plan, or a plan that does not allow it)
)

type app struct {
	stateDir string
	asJSON   bool
	verbose  bool
	planFile string
	secrets  []string // --secret NAME=value or NAME=@file
	n        *nexus.Nexus
	// exit is the code a command wants (exec: the guest command's).
	exit int
}

func main() {
	a := &app{}
	root := a.commands()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	root.SetContext(ctx)
	err := root.ExecuteContext(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nexus:", err)
		os.Exit(exitCode(err))
	}
	os.Exit(a.exit)
}

func exitCode(err error) int {
	var ue usageError
	if errors.As(err, &ue) || isCobraUsage(err) {
		return exitUsage
	}
	// The classification is nexus's, shared with the HTTP API.
	switch nexus.Kind(err) {
	case nexus.KindBadInput:
		// A setting or name nexus refused before anything ran.
		return exitUsage
	case nexus.KindIllegal:
		return exitIllegal
	case nexus.KindNotFound:
		return exitMissing
	case nexus.KindBusy:
		return exitBusy
	case nexus.KindNameTaken:
		return exitTaken
	case nexus.KindRefused:
		return exitRefused
	}
	return exitError
}

type usageError struct{ error }

// opensLate marks a command that opens the state directory itself, later
// than the others do (before they run).
const opensLate = "nexus/opens-late"

// isCobraUsage says whether err is one of cobra's own usage errors, which
// it makes as plain strings: an unknown command ("nexus snapshots").
func isCobraUsage(err error) bool {
	return strings.HasPrefix(err.Error(), "unknown command ")
}

// flagError rewords pflag's refusal of a flag's value, which quotes Go's
// parser ('strconv.ParseInt: parsing "2x": invalid syntax'), into what
// the flag wants; other flag errors pass as they are.
func flagError(cmd *cobra.Command, err error) error {
	var name, value string
	if _, scanErr := fmt.Sscanf(err.Error(), "invalid argument %q for %q flag", &value, &name); scanErr != nil {
		return usageError{err}
	}
	long := name
	if i := strings.LastIndex(name, "--"); i >= 0 {
		long = name[i+2:]
	}
	want := "a valid value"
	if f := cmd.Flags().Lookup(long); f != nil {
		switch f.Value.Type() {
		case "int", "int64", "int32", "uint", "uint64":
			want = "a whole number"
		case "bool":
			want = "true or false"
		case "duration":
			want = "a duration such as 30s or 5m"
		}
	}
	return usageError{fmt.Errorf("%s %q: want %s", name, value, want)}
}

// open opens the state directory (reconciling it) for a command.
func (a *app) open(cmd *cobra.Command) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if a.verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	self, _ := os.Executable()
	n, err := nexus.Open(cmd.Context(), nexus.Options{StateDir: a.stateDir, Log: log, SelfForFill: self})
	if err != nil {
		return err
	}
	a.n = n
	if a.planFile != "" {
		b, err := os.ReadFile(a.planFile)
		if err != nil {
			return usageError{fmt.Errorf("--plan: %w", err)}
		}
		a.n = n.WithPlan(b)
	}
	if len(a.secrets) > 0 {
		m, err := parseSecrets(a.secrets)
		if err != nil {
			return usageError{err}
		}
		a.n = a.n.WithSecrets(m)
	}
	return nil
}

// parseSecrets reads --secret flags: NAME=value, or NAME=@file for a
// value read from a file (the way to keep it out of the process list
// and the shell's history).
func parseSecrets(flags []string) (map[string][]byte, error) {
	m := map[string][]byte{}
	for _, f := range flags {
		name, v, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("--secret %.30q: want NAME=value or NAME=@file", name)
		}
		if _, dup := m[name]; dup {
			return nil, fmt.Errorf("--secret %s given twice", name)
		}
		if file, ok := strings.CutPrefix(v, "@"); ok {
			b, err := os.ReadFile(file)
			if err != nil {
				return nil, fmt.Errorf("--secret %s: %w", name, err)
			}
			m[name] = b
			continue
		}
		m[name] = []byte(v)
	}
	if err := nexus.CheckSecrets(m); err != nil {
		return nil, fmt.Errorf("--secret: %w", err)
	}
	return m, nil
}

func (a *app) commands() *cobra.Command {
	root := &cobra.Command{
		Use:   "nexus",
		Short: "Orchestrate nether sandboxes: records, lifecycle, snapshots, forks, warm pools",
		Long: `nexus keeps a record of every sandbox in a state directory and runs each
sandbox's nether detached, so sandboxes outlive the nexus command that
started them. Every command first reconciles the records with the
processes that really run.

State directory: --state-dir, else NEXUS_STATE_DIR, else /var/lib/nexus
for root and $XDG_DATA_HOME/nexus otherwise. The nether binary: NEXUS_NETHER,
else nether next to nexus, else nether on PATH.

Exit status: 0 done; 1 failed; 2 bad usage (a flag, a name or a setting
refused before anything ran); 3 the lifecycle does not allow
it; 4 no such sandbox or snapshot; 5 another operation holds the sandbox;
6 the name is taken; 7 admission refused it (see nexus trust). nexus exec
exits with the guest command's status.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Name() == "help" || cmd.Name() == "completion" || cmd.Annotations[opensLate] != "" {
				return nil
			}
			return a.open(cmd)
		},
	}
	root.SetFlagErrorFunc(flagError)
	root.PersistentFlags().StringVar(&a.stateDir, "state-dir", "", "state directory (default: NEXUS_STATE_DIR, /var/lib/nexus as root, else $XDG_DATA_HOME/nexus)")
	root.PersistentFlags().BoolVar(&a.asJSON, "json", false, "print JSON for programs instead of tables")
	root.PersistentFlags().StringVar(&a.planFile, "plan", "", "the signed plan (nexus plan sign) that admits this create, start, fork or resume; required once the state directory trusts a plan authority")
	root.PersistentFlags().StringArrayVar(&a.secrets, "secret", nil, "NAME=value or NAME=@file: a secret this start, fork or resume delivers to the guest's /run/secrets/NAME (repeat for more; never stored; under admission the plan must list NAME)")
	root.PersistentFlags().BoolVarP(&a.verbose, "verbose", "v", false, "log what nexus does on stderr")
	root.AddCommand(a.createCmd(), a.verbCmd("start", "Boot a created or stopped sandbox", (*nexus.Nexus).Start),
		a.verbCmd("stop", "Shut a running sandbox's guest down cleanly", (*nexus.Nexus).Stop),
		a.verbCmd("pause", "Park a running sandbox: its memory goes to disk and it costs no memory", (*nexus.Nexus).Pause),
		a.verbCmd("resume", "Wake a paused sandbox", (*nexus.Nexus).Resume),
		a.rmCmd(), a.lsCmd(), a.inspectCmd(), a.execCmd(), a.cpCmd(), a.logsCmd(),
		a.snapshotCmd(), a.forkCmd(), a.poolCmd(), a.treeCmd(), a.auditCmd(), a.keyCmd(), a.planCmd(), a.trustCmd(), a.serveCmd())
	return root
}

func args(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if len(a) != n {
			return usageError{fmt.Errorf("%s takes %d argument(s), got %d (see nexus %s --help)", cmd.Name(), n, len(a), cmd.Name())}
		}
		return nil
	}
}

func (a *app) print(v any, table func(w io.Writer)) error {
	if a.asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	table(w)
	return w.Flush()
}

// short is an id as tables show it: the time part and 30 random bits,
// which any command takes as a prefix.
func short(id string) string {
	if len(id) > 16 {
		return id[:16]
	}
	return id
}

func (a *app) createCmd() *cobra.Command {
	var req nexus.CreateRequest
	var start bool
	cmd := &cobra.Command{
		Use:   "create [--name NAME] [settings]",
		Short: "Make a sandbox record (created); --start boots it too",
		Long: `Make a sandbox record (created); --start boots it too.

--rootfs, --run-as and --disk/--disk-size-mb are nether's rootfs, run_as,
disk and disk_size_mb. A sandbox with a disk keeps it in its directory
(disk.img): stop and start boot again on the same file, so /data survives;
rm removes it. Each child of a fork gets a copy-on-write layer of its own
over the snapshot's disk (disk.qcow2 in the child's directory).`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			sb, err := a.n.Create(cmd.Context(), req)
			if err != nil {
				return err
			}
			if start {
				if sb, err = a.n.Start(cmd.Context(), sb.ID); err != nil {
					return err
				}
			}
			return a.print(sb, func(w io.Writer) { created(w, sb.ID, sb.Name) })
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Name, "name", "", "a unique name (letters, digits, - _ .)")
	f.BoolVar(&start, "start", false, "boot it at once")
	f.IntVar(&req.Config.CPUs, "cpus", 0, "vCPUs (nether's default: 1)")
	f.IntVar(&req.Config.RAMMB, "ram-mb", 0, "guest RAM in MiB (nether's default: 512)")
	f.BoolVar(&req.Config.Net, "net", false, "give the guest a network behind nether's NAT and firewall")
	f.StringVar(&req.Config.NetAllow, "net-allow", "", "CIDR list let through the firewall's default deny")
	f.StringVar(&req.Config.NetBlock, "net-block", "", "CIDR list always blocked")
	f.Int64Var(&req.Config.MaxRuntimeS, "max-runtime-s", 0, "end a session after this many seconds")
	f.Int64Var(&req.Config.MaxCPUS, "max-cpu-s", 0, "end a session after this much guest CPU time")
	f.Int64Var(&req.Config.IdleTimeoutS, "idle-timeout-s", 0, "end a session after this long idle")
	f.IntVar(&req.Config.AppPort, "app-port", 0, "the tenant's server port in the guest (data plane)")
	f.IntVar(&req.Config.EgressPort, "egress-port", 0, "the guest port of the egress plane")
	f.BoolVar(&req.Config.GPU, "gpu", false, "give the guest a display")
	f.StringVar(&req.Config.Rootfs, "rootfs", "", "the guest's root image: a path, or busybox for the initramfs alone (default: the Debian image setup built)")
	f.StringVar(&req.Config.RunAs, "run-as", "", "run every command as this guest user (default root)")
	var disk bool
	f.BoolVar(&disk, "disk", false, fmt.Sprintf("give it a persistent disk at /data (%d MiB unless --disk-size-mb says)", conf.DefaultDiskSizeMB))
	f.IntVar(&req.Config.DiskSizeMB, "disk-size-mb", 0, fmt.Sprintf("give it a persistent disk at /data of this many MiB (%d-%d; implies --disk)", conf.MinDiskSizeMB, conf.MaxDiskSizeMB))
	cmd.PreRunE = func(cmd *cobra.Command, _ []string) error {
		if cmd.Flags().Changed("disk-size-mb") && req.Config.DiskSizeMB == 0 {
			// 0 would read as no disk: say so rather than drop the flag.
			return usageError{fmt.Errorf("--disk-size-mb 0: a disk is %d to %d MiB; leave the flag out for no disk", conf.MinDiskSizeMB, conf.MaxDiskSizeMB)}
		}
		if disk && req.Config.DiskSizeMB == 0 {
			req.Config.DiskSizeMB = conf.DefaultDiskSizeMB
		}
		if cmd.Flags().Changed("disk") && !disk && req.Config.DiskSizeMB != 0 {
			return usageError{errors.New("--disk=false with --disk-size-mb: --disk-size-mb gives a disk; leave both out for none")}
		}
		if r := req.Config.Rootfs; r != "" && r != conf.RootfsBusybox {
			// nether runs in the sandbox's directory: a path relative to
			// where nexus was run is made absolute here.
			abs, err := filepath.Abs(r)
			if err != nil {
				return fmt.Errorf("--rootfs %s: %w", r, err)
			}
			req.Config.Rootfs = abs
		}
		return nil
	}
	return cmd
}

func (a *app) verbCmd(use, short string, op func(*nexus.Nexus, context.Context, string) (*nexus.Sandbox, error)) *cobra.Command {
	return &cobra.Command{
		Use:   use + " SANDBOX",
		Short: short,
		Args:  args(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := op(a.n, cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.print(sb, func(w io.Writer) { fmt.Fprintf(w, "%s %s\n", sb.Ref(), sb.State) })
		},
	}
}

func (a *app) rmCmd() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "rm SANDBOX...",
		Short: "Remove sandboxes (a running one needs --force, which stops it first)",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError{errors.New("rm takes one or more sandboxes")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var errs []error
			for _, ref := range args {
				if err := a.n.Remove(cmd.Context(), ref, force); err != nil {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "stop a running sandbox first")
	return cmd
}

func (a *app) lsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List sandboxes",
		Args:  args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			sbs, err := a.n.List(cmd.Context())
			if err != nil {
				return err
			}
			if a.asJSON {
				return a.print(sbs, nil)
			}
			names := a.names(cmd.Context(), sbs, nil)
			return a.print(sbs, func(w io.Writer) {
				fmt.Fprintln(w, "ID\tNAME\tSTATE\tPARENT\tSNAPSHOT\tPLAN\tCREATED\tNOTE")
				for _, sb := range sbs {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", short(sb.ID), dash(sb.Name), sb.State, names.of(sb.Parent),
						names.of(sb.Snapshot), admission(sb), sb.Created.Local().Format("2006-01-02 15:04:05"), note(sb, names))
				}
			})
		},
	}
}

// note is ls's last column: why a sandbox is in error or stopped (the
// reason of its last final record), or the pool that holds it.
func note(sb *nexus.Sandbox, names names) string {
	switch {
	case sb.Pool != "":
		return "pool of " + names.of(sb.Pool)
	case sb.Reason != "":
		return sb.Reason
	}
	if st := nexus.ParseFinal(sb.Final); st != nil && sb.State != lifecycle.Running {
		return "last stop: " + st.Reason
	}
	return ""
}

// names shows records by name where they have one: ids of sandboxes and
// snapshots to their names.
type names map[string]string

// names reads every sandbox's and snapshot's name; a caller that has
// already listed one kind passes it (nil is read here). A table that
// cannot read them shows ids, shortened, as it did.
func (a *app) names(ctx context.Context, sbs []*nexus.Sandbox, ss []*nexus.Snapshot) names {
	if sbs == nil {
		sbs, _ = a.n.List(ctx)
	}
	if ss == nil {
		ss, _ = a.n.SnapshotList(ctx)
	}
	m := names{}
	for _, sb := range sbs {
		m[sb.ID] = sb.Name
	}
	for _, s := range ss {
		m[s.ID] = s.Name
	}
	return m
}

// of is id's name, else the shortened id, else "-" for no id.
func (m names) of(id string) string {
	switch {
	case id == "":
		return "-"
	case m[id] != "":
		return m[id]
	}
	return short(id)
}

// created is what create, fork and snapshot print for each record made:
// its id, then its name ("-" for none), so `cut -f1` or awk still get ids.
func created(w io.Writer, id, name string) { fmt.Fprintf(w, "%s\t%s\n", id, dash(name)) }

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (a *app) inspectCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "inspect SANDBOX",
		Short: "Show a sandbox's record (JSON)",
		Args:  args(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := a.n.InspectDetail(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			a.asJSON = true
			return a.print(struct {
				nexus.Detail
				Admission string `json:"admission"`
			}{d, admission(d.Sandbox)}, nil)
		},
	}
}

// admission is how a sandbox was admitted: the digest of its plan (12
// digits), or "unadmitted".
func admission(sb *nexus.Sandbox) string {
	if sb.Plan == "" {
		return "unadmitted"
	}
	return sb.Plan[:min(12, len(sb.Plan))]
}

func (a *app) execCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "exec SANDBOX -- COMMAND...",
		Short: "Run a shell command in a running sandbox; exits with its status",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return usageError{errors.New("exec takes a sandbox and a command: nexus exec web -- ls /")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			line := strings.Join(args[1:], " ")
			if a.asJSON {
				// The API's exec?format=json answer: the output whole,
				// then the exit status, as one object.
				r, err := a.n.ExecBuffered(cmd.Context(), args[0], line)
				if err != nil {
					return err
				}
				a.exit = r.Exit
				return a.print(r, nil)
			}
			code, err := a.n.Exec(cmd.Context(), args[0], line, os.Stdout)
			if err != nil {
				return err
			}
			a.exit = code
			return nil
		},
	}
}

func (a *app) cpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file into or out of a running sandbox: nexus cp f web:/tmp/f, nexus cp web:/etc/os-release .",
		Args:  args(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := args[0], args[1]
			if sb, path, ok := strings.Cut(dst, ":"); ok && !strings.Contains(src, ":") {
				return a.n.CopyIn(cmd.Context(), sb, src, path)
			}
			if sb, path, ok := strings.Cut(src, ":"); ok && !strings.Contains(dst, ":") {
				if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
					dst = dst + "/" + path[strings.LastIndexByte(path, '/')+1:]
				}
				return a.n.CopyOut(cmd.Context(), sb, path, dst)
			}
			return usageError{errors.New("cp copies between the host and one sandbox: exactly one of SRC and DST is SANDBOX:PATH")}
		},
	}
}

func (a *app) logsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "logs SANDBOX",
		Short: "Print a sandbox's console log",
		Args:  args(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := a.n.Logs(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			if a.asJSON {
				// Bounded as console.log is (console_log_max_bytes).
				b, err := io.ReadAll(f)
				if err != nil {
					return err
				}
				out := map[string]string{"log": string(b), "encoding": "utf-8"}
				if !utf8.Valid(b) {
					out["log"], out["encoding"] = base64.StdEncoding.EncodeToString(b), "base64"
				}
				return a.print(out, nil)
			}
			_, err = io.Copy(os.Stdout, f)
			return err
		},
	}
}

func (a *app) snapshotCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "snapshot", Short: "Snapshots: create, ls, inspect, rm"}
	var clean bool
	create := &cobra.Command{
		Use:   "create SANDBOX [NAME]",
		Short: "Capture a running sandbox into the snapshot store; it keeps running",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 || len(args) > 2 {
				return usageError{errors.New("snapshot create takes a sandbox and an optional name")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			name := ""
			if len(args) == 2 {
				name = args[1]
			}
			create := a.n.SnapshotCreate
			if clean {
				create = a.n.SnapshotCreateClean
			}
			s, err := create(cmd.Context(), args[0], name)
			if err != nil {
				return err
			}
			return a.print(s, func(w io.Writer) { created(w, s.ID, s.Name) })
		},
	}
	create.Flags().BoolVar(&clean, "clean", false, "a clean snapshot, which any admitted plan may fork: refused, naming why, for a sandbox that may hold a tenant's state (secrets or planes in its plan, app or egress ports, traffic on its NIC or planes)")
	cmd.AddCommand(create, &cobra.Command{
		Use:   "ls",
		Short: "List snapshots",
		Args:  args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ss, err := a.n.SnapshotList(cmd.Context())
			if err != nil {
				return err
			}
			if a.asJSON {
				return a.print(ss, nil)
			}
			names := a.names(cmd.Context(), nil, ss)
			return a.print(ss, func(w io.Writer) {
				fmt.Fprintln(w, "ID\tNAME\tSOURCE\tCLASS\tSIZE\tREFS\tCREATED")
				for _, s := range ss {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%.1f MiB\t%d\t%s\n", short(s.ID), dash(s.Name), names.of(s.Source), nexus.SnapshotClass(s), float64(s.Size)/(1<<20), len(s.Refs),
						s.Created.Local().Format("2006-01-02 15:04:05"))
				}
			})
		},
	}, &cobra.Command{
		Use:   "inspect SNAPSHOT",
		Short: "Show a snapshot's record (JSON)",
		Args:  args(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := a.n.SnapshotInspect(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			a.asJSON = true
			return a.print(s, nil)
		},
	}, &cobra.Command{
		Use:   "rm SNAPSHOT",
		Short: "Remove a snapshot no sandbox depends on",
		Args:  args(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.n.SnapshotRemove(cmd.Context(), args[0])
		},
	})
	return cmd
}

func (a *app) keyCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "key", Short: "Plan keys: the ed25519 key pairs that sign plans"}
	cmd.AddCommand(&cobra.Command{
		Use:   "create NAME",
		Short: "Make a plan key pair in the state directory (keys/NAME.key, 0600) and print its public key's path",
		Args:  args(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := a.n.CreateKey(args[0])
			if err != nil {
				return usageError{err}
			}
			return a.print(map[string]string{"name": args[0], "public_key_file": path}, func(w io.Writer) { fmt.Fprintln(w, path) })
		},
	})
	return cmd
}

func (a *app) planCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "plan", Short: "Plans: what a sandbox may be and do, signed by a plan authority"}
	var key, out string
	sign := &cobra.Command{
		Use:   "sign --key NAME FILE",
		Short: "Sign a plan with a key made by nexus key create; prints the signed plan (or writes it to -o)",
		Args:  args(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if key == "" {
				return usageError{errors.New("plan sign needs --key NAME (nexus key create NAME makes one)")}
			}
			b, err := os.ReadFile(args[0])
			if err != nil {
				return usageError{err}
			}
			p, err := trust.DecodePlan(b)
			if err != nil {
				return usageError{fmt.Errorf("%s: %w", args[0], err)}
			}
			priv, err := a.n.Keyring().Key(key)
			if err != nil {
				return err
			}
			signed, err := trust.Sign(p, priv, key)
			if err != nil {
				return usageError{fmt.Errorf("%s: %w", args[0], err)}
			}
			signed = append(signed, '\n')
			if out == "" {
				_, err = os.Stdout.Write(signed)
				return err
			}
			return os.WriteFile(out, signed, 0o644)
		},
	}
	sign.Flags().StringVar(&key, "key", "", "the plan key's name")
	sign.Flags().StringVarP(&out, "output", "o", "", "write the signed plan here instead of stdout")
	cmd.AddCommand(&cobra.Command{
		Use:   "new",
		Short: "Print a valid plan to edit: a fresh nonce, valid for an hour from now, 1 CPU, 512 MiB, no network, no grants",
		Args:  args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := json.MarshalIndent(trust.NewPlan(time.Now()), "", "  ")
			if err != nil {
				return err
			}
			fmt.Println(string(b))
			return nil
		},
	}, sign, &cobra.Command{
		Use:   "verify FILE",
		Short: "Check a signed plan as admission will (signature, trusted authority, fields, validity now) and print its digest",
		Args:  args(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := os.ReadFile(args[0])
			if err != nil {
				return usageError{err}
			}
			trusted, err := a.n.Keyring().Trusted()
			if err != nil {
				return err
			}
			v, err := trust.Verify(b, trusted, time.Now())
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			return a.print(map[string]string{"digest": v.Digest, "authority": v.Authority.Fingerprint, "authority_name": v.Authority.Name},
				func(w io.Writer) {
					fmt.Fprintf(w, "plan %s signed by %s (%s), valid until %s\n", v.Digest, v.Authority.Fingerprint, v.Authority.Name,
						v.Plan.NotAfter.Local().Format(time.RFC3339))
				})
		},
	})
	return cmd
}

func (a *app) trustCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "trust", Short: "The plan authorities this state directory trusts, and nexus's own admission key"}
	cmd.AddCommand(&cobra.Command{
		Use:   "add PUBKEY-FILE",
		Short: "Trust a plan authority: a public key as nexus key create wrote it (keys/NAME.pub)",
		Args:  args(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := os.ReadFile(args[0])
			if err != nil {
				return usageError{err}
			}
			au, err := a.n.Trust(b)
			if err != nil {
				return usageError{fmt.Errorf("%s: %w", args[0], err)}
			}
			return a.print(au, func(w io.Writer) { fmt.Fprintf(w, "trusted %s (%s)\n", au.Fingerprint, au.Name) })
		},
	}, &cobra.Command{
		Use:   "ls",
		Short: "List the trusted plan authorities",
		Args:  args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			as, err := a.n.Keyring().Trusted()
			if err != nil {
				return err
			}
			return a.print(as, func(w io.Writer) {
				fmt.Fprintln(w, "FINGERPRINT\tNAME")
				for _, au := range as {
					fmt.Fprintf(w, "%s\t%s\n", au.Fingerprint, dash(au.Name))
				}
			})
		},
	}, &cobra.Command{
		Use:   "pubkey",
		Short: "Print nexus's admission key (made on first use): what services verify identity tokens with",
		Args:  args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			priv, err := a.n.Keyring().AdmissionKey()
			if err != nil {
				return err
			}
			pub := priv.Public().(ed25519.PublicKey)
			line := trust.FormatPublic(pub, "nexus-admission-"+a.n.NodeID())
			return a.print(map[string]string{"public_key": strings.TrimSpace(line), "fingerprint": trust.Fingerprint(pub)},
				func(w io.Writer) { fmt.Fprint(w, line) })
		},
	}, a.verifyTokenCmd())
	return cmd
}

// verifyTokenCmd checks an identity token as a service the guest calls
// would: with the admission key's public half.
func (a *app) verifyTokenCmd() *cobra.Command {
	var pubFile string
	cmd := &cobra.Command{
		Use:   "verify-token TOKEN|-",
		Short: "Check an identity token (a guest's /run/nether/identity token=) and print who it names: with --pubkey FILE (nexus trust pubkey's output), else this state directory's admission key",
		Args:  args(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			tok := args[0]
			if tok == "-" {
				b, err := io.ReadAll(io.LimitReader(os.Stdin, 16<<10))
				if err != nil {
					return err
				}
				tok = string(b)
			}
			var pub ed25519.PublicKey
			if pubFile != "" {
				b, err := os.ReadFile(pubFile)
				if err != nil {
					return usageError{err}
				}
				if pub, _, err = trust.ParsePublic(b); err != nil {
					return usageError{fmt.Errorf("%s: %w", pubFile, err)}
				}
			} else {
				priv, err := a.n.Keyring().AdmissionKey()
				if err != nil {
					return err
				}
				pub = priv.Public().(ed25519.PublicKey)
			}
			t, err := trust.VerifyToken(tok, pub, time.Now())
			if err != nil {
				return fmt.Errorf("%w: %w", nexus.ErrRefused, err)
			}
			return a.print(t, func(w io.Writer) {
				fmt.Fprintf(w, "node_id=%s vm_id=%s boot_id=%s plan_digest=%s expires=%s\n", t.NodeID, t.VMID, t.BootID, dash(t.PlanDigest), t.ExpiresAt.Format(time.RFC3339))
			})
		},
	}
	cmd.Flags().StringVar(&pubFile, "pubkey", "", "the public key to check with (the file nexus trust pubkey printed)")
	return cmd
}

func (a *app) auditCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "audit", Short: "The audit chain: what nexus did and refused, each record linked to the one before"}
	var sandbox string
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the audit records, oldest first",
		Args:  args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			recs, err := a.n.AuditList(cmd.Context(), sandbox)
			if err != nil {
				return err
			}
			return a.print(recs, func(w io.Writer) {
				fmt.Fprintln(w, "SEQ\tTIME\tEVENT\tSANDBOX\tPARENT\tSNAPSHOT\tOUTCOME")
				for _, r := range recs {
					fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Seq, r.Time.Local().Format("2006-01-02 15:04:05.000"), r.Event,
						dash(short(r.Sandbox)), dash(short(r.Parent)), dash(short(r.Snapshot)), r.Outcome)
				}
			})
		},
	}
	ls.Flags().StringVar(&sandbox, "sandbox", "", "only the records of this sandbox (name or id; a removed one by id), as itself or as a parent")
	verify := &cobra.Command{
		Use:   "verify",
		Short: "Check the whole chain: exit 0 and print its head, or exit 1 naming the first record that was altered or removed",
		Args:  args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			head, err := a.n.AuditVerify(cmd.Context())
			if err != nil {
				return err
			}
			return a.print(head, func(w io.Writer) {
				fmt.Fprintf(w, "audit chain intact: %d records, head %s\n", head.Records, head.Hash)
			})
		},
	}
	cmd.AddCommand(ls, verify)
	return cmd
}

func (a *app) forkCmd() *cobra.Command {
	req := nexus.ForkRequest{}
	cmd := &cobra.Command{
		Use:   "fork SANDBOX|SNAPSHOT [-n N] [--name NAME]... [--run-as USER]",
		Short: "Make N new sandboxes from a snapshot (or a running sandbox, snapshotted first)",
		Args:  args(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.From = args[0]
			if isTerminal(os.Stderr) && req.N > 1 && !a.asJSON {
				req.Progress = func(done, failed, total int) {
					fmt.Fprintf(os.Stderr, "\rforking: %d/%d up, %d failed", done, total, failed)
					if done+failed == total {
						fmt.Fprintln(os.Stderr)
					}
				}
			}
			t0 := time.Now()
			kids, err := a.n.Fork(cmd.Context(), req)
			if kids == nil {
				kids = []*nexus.Sandbox{}
			}
			perr := a.print(kids, func(w io.Writer) {
				for _, k := range kids {
					created(w, k.ID, k.Name)
				}
			})
			if a.verbose {
				fmt.Fprintf(os.Stderr, "forked %d in %s\n", len(kids), time.Since(t0).Round(time.Millisecond))
			}
			return errors.Join(err, perr)
		},
	}
	cmd.Flags().IntVarP(&req.N, "n", "n", 1, "how many children")
	cmd.Flags().StringArrayVar(&req.Names, "name", nil, "a child's name (repeat for each, or one for name-1 ... name-N)")
	cmd.Flags().BoolVar(&req.NoPool, "no-pool", false, "restore new children even when the snapshot has a warm pool")
	cmd.Flags().StringVar(&req.RunAs, "run-as", "", "run the children's commands as this guest user: narrows a root snapshot (a user's snapshot keeps its user)")
	return cmd
}

func (a *app) poolCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "pool", Short: "Warm pools: set, ls, fill"}
	var size int
	set := &cobra.Command{
		Use:   "set SNAPSHOT --size N",
		Short: "Keep N children of a snapshot restored, so forking it claims one at once (0 empties it)",
		Args:  args(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("size") {
				return usageError{errors.New("pool set needs --size")}
			}
			p, err := a.n.PoolSet(cmd.Context(), args[0], size)
			if err != nil {
				return err
			}
			return a.print(p, func(w io.Writer) {
				fmt.Fprintf(w, "pool of %s: %d\n", a.names(cmd.Context(), []*nexus.Sandbox{}, nil).of(p.Snapshot), p.Size)
			})
		},
	}
	set.Flags().IntVar(&size, "size", 0, "members to keep warm")
	var after time.Duration
	fill := &cobra.Command{
		Use:    "fill SNAPSHOT",
		Short:  "Bring a pool to its size (nexus runs it in the background after a claim)",
		Args:   args(1),
		Hidden: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			select {
			case <-time.After(after):
			case <-cmd.Context().Done():
				return cmd.Context().Err()
			}
			// Opened only now: a claim starts this process at once, and
			// opening reconciles every record, CPU the claimed child's
			// first commands need on a small host.
			if err := a.open(cmd); err != nil {
				return err
			}
			return a.n.PoolFill(cmd.Context(), args[0])
		},
	}
	fill.Annotations = map[string]string{opensLate: "true"}
	fill.Flags().DurationVar(&after, "after", 0, "wait this long first")
	cmd.AddCommand(set, &cobra.Command{
		Use:   "ls",
		Short: "List pools",
		Args:  args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ps, err := a.n.Pools(cmd.Context())
			if err != nil {
				return err
			}
			if a.asJSON {
				return a.print(ps, nil)
			}
			// Pools are named by their snapshots: no sandbox is looked up.
			names := a.names(cmd.Context(), []*nexus.Sandbox{}, nil)
			return a.print(ps, func(w io.Writer) {
				fmt.Fprintln(w, "SNAPSHOT\tSIZE\tMEMBERS\tREADY")
				for _, p := range ps {
					fmt.Fprintf(w, "%s\t%d\t%d\t%d\n", names.of(p.Snapshot), p.Size, p.Members, p.Ready)
				}
			})
		},
	}, fill)
	return cmd
}

func (a *app) treeCmd() *cobra.Command {
	var dot bool
	cmd := &cobra.Command{
		Use:   "tree [SANDBOX|SNAPSHOT]",
		Short: "Draw the lineage of sandboxes and snapshots (--dot for Graphviz)",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usageError{errors.New("tree takes at most one sandbox or snapshot")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ref := ""
			if len(args) == 1 {
				ref = args[0]
			}
			roots, err := a.n.Tree(cmd.Context(), ref)
			if err != nil {
				return err
			}
			switch {
			case a.asJSON:
				return a.print(roots, nil)
			case dot:
				nexus.WriteDot(os.Stdout, roots)
			default:
				nexus.WriteTree(os.Stdout, roots)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&dot, "dot", false, "print a Graphviz digraph")
	return cmd
}
