package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/nethersandbox/nether/nexus"
	"github.com/nethersandbox/nether/nexus/api"
)

// serveCmd is `nexus serve`: the HTTP API (see nexus/api).
func (a *app) serveCmd() *cobra.Command {
	var socket string
	cmd := &cobra.Command{
		Use:   "serve [--socket PATH]",
		Short: "Answer the same operations as JSON over HTTP on an owner-only Unix socket",
		Long: `nexus serve answers the nexus operations as JSON over HTTP on a Unix
socket (default <state-dir>/nexus.sock) that only its own user may use:
the socket is 0600 and every connection's peer uid is checked. It runs
until SIGINT or SIGTERM, then lets requests in flight finish (up to 30 s).

The API is described by its OpenAPI document, GET /v1/openapi.yaml:
  curl --unix-socket ~/.local/share/nexus/nexus.sock http://nexus/v1/openapi.yaml
A streamed exec's exit status is in the HTTP trailer Nexus-Exit-Code;
?format=json answers it in the body instead.`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if socket == "" {
				socket = filepath.Join(a.n.StateDir(), "nexus.sock")
			}
			level := slog.LevelWarn
			if a.verbose {
				level = slog.LevelInfo
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			// The state directory was opened for a command that exits soon
			// (a pool top-up then runs as a detached nexus pool fill); a
			// server stays, and tops pools up itself, on a goroutine.
			n, err := nexus.Open(cmd.Context(), nexus.Options{StateDir: a.n.StateDir(), Log: log})
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "nexus: serving the HTTP API on %s (state directory %s)\n", socket, n.StateDir())
			if err := api.Serve(cmd.Context(), n, socket, log); err != nil {
				return err
			}
			fmt.Fprintln(os.Stderr, "nexus: the HTTP API is shut down")
			return nil
		},
	}
	cmd.Flags().StringVar(&socket, "socket", "", "the Unix socket to serve on (default <state-dir>/nexus.sock)")
	return cmd
}
