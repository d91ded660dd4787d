package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/nethersandbox/nether/internal/unixsock"
	"github.com/nethersandbox/nether/nexus"
)

// ShutdownGrace is how long Serve lets requests in flight finish once its
// context ends. An operation still running then (a fork of many, a pause
// writing a large guest's memory) is cancelled, which ends it the way a
// failure would: its record keeps a state that is true, and its lease is
// released.
const ShutdownGrace = 30 * time.Second

// cancelGrace bounds the wait for cancelled requests to return.
const cancelGrace = 15 * time.Second

// Serve answers the API for n on an owner-only (0600) Unix socket at
// socketPath until ctx ends, then shuts down gracefully (ShutdownGrace).
// Only the server's own user may connect: every connection's peer uid is
// checked (SO_PEERCRED), and any other user's requests are refused with
// 403, whatever the socket's mode. A stale socket a dead server left is
// replaced; a live one is refused. log may be nil.
func Serve(ctx context.Context, n *nexus.Nexus, socketPath string, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln, err := unixsock.Listen(socketPath, "nexus socket")
	if err != nil {
		return err
	}
	defer ln.Close()
	// Requests outlive ctx by the grace period: their context is
	// cancelled only when it runs out.
	base, cancelBase := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBase()
	var inflight sync.WaitGroup
	api := ownerOnly(os.Getuid(), NewHandler(n, log), log)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inflight.Add(1)
			defer inflight.Done()
			api.ServeHTTP(w, r)
		}),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, peerKey{}, peerOf(c))
		},
		BaseContext: func(net.Listener) context.Context { return base },
		// The socket is owner-only, but a stuck client of the owner's
		// must not hold a connection open forever either.
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("serving the nexus API on %s: %w", socketPath, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("nexus api: requests still running after the shutdown grace; cancelling them", "grace", ShutdownGrace, "err", err)
		cancelBase()
		srv.Close()
		returned := make(chan struct{})
		go func() { inflight.Wait(); close(returned) }()
		select {
		case <-returned:
		case <-time.After(cancelGrace):
			log.Warn("nexus api: cancelled requests did not return; exiting under them (their leases lapse and the next nexus reconciles)", "waited", cancelGrace)
		}
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving the nexus API on %s: %w", socketPath, err)
	}
	return nil
}

// peer is who is at the other end of a connection, as the kernel says.
type peer struct {
	uid int
	err error
}

type peerKey struct{}

func peerOf(c net.Conn) peer {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return peer{uid: -1, err: fmt.Errorf("a %T is not a Unix connection: its peer cannot be known", c)}
	}
	uid, err := unixsock.PeerUID(uc)
	return peer{uid: uid, err: err}
}

// admit decides whether a peer may use the API: only the server's own
// user, and nobody when the peer cannot be known.
func admit(p peer, self int) error {
	if p.err != nil {
		return fmt.Errorf("permission denied: the peer's credentials: %w", p.err)
	}
	if p.uid != self {
		return fmt.Errorf("permission denied: the nexus socket is owner-only (uid %d), and this client is uid %d", self, p.uid)
	}
	return nil
}

// ownerOnly refuses requests whose connection's peer admit refuses. A
// request without a peer in its context (a connection that did not come
// through Serve's listener) is refused too.
func ownerOnly(self int, next http.Handler, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := r.Context().Value(peerKey{}).(peer)
		if !ok {
			p = peer{uid: -1, err: errors.New("no peer credentials were taken for this connection")}
		}
		if err := admit(p, self); err != nil {
			log.Warn("nexus api: refused a client of another user", "peer_uid", p.uid, "err", p.err)
			w.Header().Set("Connection", "close")
			writeError(w, &apiError{status: http.StatusForbidden, kind: kindForbidden, err: err})
			return
		}
		next.ServeHTTP(w, r)
	})
}
