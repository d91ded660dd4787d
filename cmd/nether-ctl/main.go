// Command nether-ctl is the reference client for the nether control
// socket: it connects, performs the __info__ handshake, sends one command
// and streams the reply to stdout, exiting with the guest command's exit
// code.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"image/png"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/nethersandbox/nether/client"
)

// exitFailure is nether-ctl's own failure code, chosen (as docker and
// chroot do) from the range a guest command rarely uses, so that scripts
// can tell "nether-ctl failed" from "the command failed".
const (
	exitFailure     = 125
	exitInterrupted = 130
)

const usage = `Usage: nether-ctl [-timeout DURATION] [-png FILE] SOCKET COMMAND...

Send one command to a running nether sandbox over its control socket (the
control_socket= path from nether.conf) and print the reply.

COMMAND is either a shell command line, run inside the guest, or a control
command such as __info__, __stats__, __help__, __put__ HOST GUEST,
__get__ GUEST HOST, __snapshot__ [PATH] or __shutdown__. The words of
COMMAND are joined with single spaces into one line; quote shell syntax
such as &&, |, > or $VAR so that your local shell passes it through to the
guest instead of interpreting it. Output is streamed to stdout as it
arrives.

The observe commands __events__ [SEQ], __cmdlog__, __netlog__,
__screen__, __screendiff__, __frame__ and __framediff__ print their reply
exactly as nether sends it, header line included (__frame__ is a binary
PPM image; __framediff__ is binary too), and exit 0 once it is complete.

Options:
  -timeout DURATION   give up after this long (e.g. 30s, 5m); default: wait
                      as long as the command runs
  -png FILE           with __frame__ only: save the frame to FILE as a PNG
                      image instead of writing the PPM to stdout
  -h, --help          show this help

Exit status:
  0-255   the guest command's own exit code (0 for a successful control
          command such as __info__ or __put__, or a complete observe reply)
  125     nether-ctl could not do its job: bad usage, cannot connect,
          protocol error, timeout, or nether rejected the command (the
          "ERR ..." reason is printed on stderr)
  130     interrupted (Ctrl-C); the sandbox keeps running

Examples:
  nether-ctl /tmp/nether.sock __info__
  nether-ctl /tmp/nether.sock uname -a
  nether-ctl /tmp/nether.sock 'cd /tmp && make test'
  nether-ctl -timeout 60s /tmp/nether.sock __put__ build.tar /tmp/build.tar
  nether-ctl /tmp/nether.sock __events__ 42
  nether-ctl -png screen.png /tmp/nether.sock __frame__
  nether-ctl /tmp/nether.sock __shutdown__
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("nether-ctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // usage errors are reported below, once
	timeout := fs.Duration("timeout", 0, "")
	pngPath := fs.String("png", "", "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usage)
			return 0
		}
		fmt.Fprintf(stderr, "nether-ctl: %v\nRun 'nether-ctl --help' for usage.\n", err)
		return exitFailure
	}
	if fs.NArg() < 2 {
		fmt.Fprintf(stderr, "nether-ctl: need a socket path and a command\nRun 'nether-ctl --help' for usage.\n")
		return exitFailure
	}
	sock := fs.Arg(0)
	line := strings.Join(fs.Args()[1:], " ")
	if *pngPath != "" && line != "__frame__" {
		fmt.Fprintf(stderr, "nether-ctl: -png only applies to __frame__, not to %q\nRun 'nether-ctl --help' for usage.\n", line)
		return exitFailure
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}

	c, err := client.Dial(ctx, sock)
	if err != nil {
		return report(ctx, stderr, connectMessage(sock, err), err)
	}
	defer c.Close()
	// nether-ctl streams to stdout and keeps nothing in memory, so there
	// is no reason to discard any output.
	c.SetMaxBody(0)

	if *pngPath != "" {
		if err := saveFramePNG(ctx, c, *pngPath); err != nil {
			return report(ctx, stderr, "", err)
		}
		return 0
	}
	exit, err := c.Run(ctx, line, stdout)
	if err != nil {
		return report(ctx, stderr, "", err)
	}
	if exit > 255 { // cannot happen with a conforming server; never wrap
		exit = 255
	}
	return exit
}

// saveFramePNG fetches the framebuffer and writes it to path as a PNG.
// The frame is fetched first, so a failed fetch (no gpu=1, say) leaves an
// existing file alone; a failed write removes the partial file.
func saveFramePNG(ctx context.Context, c *client.Client, path string) error {
	frame, err := c.Frame(ctx)
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("saving the frame: %w", err)
	}
	err = png.Encode(f, frame.Image())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("saving the frame as PNG in %s: %w", path, err)
	}
	return nil
}

// report prints err for a person and picks the exit status.
func report(ctx context.Context, stderr io.Writer, msg string, err error) int {
	var ce *client.ControlError
	switch {
	case errors.As(err, &ce):
		line := ce.Msg
		if line == "" {
			line = fmt.Sprintf("ERR (no reason given, exit %d)", ce.Exit)
		}
		fmt.Fprintln(stderr, line)
		return exitFailure
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		fmt.Fprintln(stderr, "nether-ctl: interrupted (the sandbox keeps running)")
		return exitInterrupted
	case errors.Is(err, context.DeadlineExceeded):
		fmt.Fprintln(stderr, "nether-ctl: timed out (see -timeout); the sandbox keeps running")
		return exitFailure
	}
	if msg == "" {
		msg = "nether-ctl: " + err.Error()
	}
	fmt.Fprintln(stderr, msg)
	return exitFailure
}

func connectMessage(sock string, err error) string {
	var hint string
	switch {
	case errors.Is(err, syscall.ENOENT):
		hint = "no such file (is nether running with control_socket= set?)"
	case errors.Is(err, syscall.ECONNREFUSED):
		hint = "connection refused (stale socket file: is nether still running?)"
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		hint = "permission denied (the control socket is owner-only: run as the user that started nether)"
	case errors.Is(err, syscall.ENOTSOCK):
		hint = "not a socket (check the control_socket= path)"
	default:
		var ce *client.ControlError
		if errors.As(err, &ce) {
			return "" // printed as the ERR line by report
		}
		return "nether-ctl: " + err.Error()
	}
	return fmt.Sprintf("nether-ctl: cannot connect to %s: %s", sock, hint)
}
