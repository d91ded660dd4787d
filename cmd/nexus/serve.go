package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// serveCmd is `nexus serve`: the HTTP API (see nexus/api).
func (a *app) serveCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "serve --socket PATH",
		Short: "Answer the same operations as JSON over HTTP on an owner-only Unix socket",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return errors.New("nexus serve: not built yet")
		},
	}
}
