// Package plane is the host end of a sandbox's data and egress planes.
//
// The data plane: nether listens on data_socket (owner-only); each
// connection to it becomes a channel stream to the agent, which connects
// it to the tenant's ordinary server on the guest's 127.0.0.1:<app_port>.
// The egress plane is its mirror: each connection the tenant makes to the
// guest's 127.0.0.1:<egress_port> arrives as a guest-opened stream, and
// nether dials the platform's egress_socket for it, writing one preamble
// line before any tenant byte:
//
//	NETHER-EGRESS v1 conn=<id> resume=<0|1> boot=<boot_id>
//
// boot names the sandbox's boot (restore, wake, claim) the connection
// belongs to, so a platform can tell a fork's connections from its
// parent's, and a woken park's revived ones from those of the boot that
// opened them. It came after v1's first two fields: a reader of v1 takes
// the fields as key=value words and ignores one it does not know. boot is
// left out when nether has none to give (a Config without BootID).
//
// An egress stream is guest memory, so it survives a park: the woken
// sandbox re-dials egress_socket for it with resume=1, and whatever the
// platform writes reaches the tenant's original recv().
//
// Both planes share the connection cap (max_data_conns) and the rate cap
// (data_rate_kbps, guest -> host). Guest -> host bytes are read from the
// stream, which grants the guest credit, only as they are delivered to
// the platform's socket: a platform that stops reading stops the guest's
// sender at its window, never the vCPU or another connection, and a
// paced delivery paces the sender without dropping a byte.
package plane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
	"github.com/nethersandbox/nether/internal/pace"
	"github.com/nethersandbox/nether/internal/unixsock"
)

// MaxConns is the default and the ceiling of max_data_conns.
const MaxConns = 48

// Preamble is the line nether writes to the platform's egress socket
// before any tenant byte; boot is the sandbox's boot id ("" leaves the
// field out).
func Preamble(conn string, resume bool, boot string) string {
	r := 0
	if resume {
		r = 1
	}
	if boot == "" {
		return fmt.Sprintf("NETHER-EGRESS v1 conn=%s resume=%d\n", conn, r)
	}
	return fmt.Sprintf("NETHER-EGRESS v1 conn=%s resume=%d boot=%s\n", conn, r, boot)
}

// Config is what the planes need from the session.
type Config struct {
	AppPort      uint16 // the tenant's server in the guest; 0 = no data plane
	DataSocket   string // nether's listener; "" = no data plane
	EgressSocket string // the platform's listener; "" = no egress plane
	MaxConns     int    // both planes together (default and ceiling MaxConns)
	IdleMS       int64  // a data connection idle both ways this long is reaped; 0 = off
	RateKbps     int64  // guest -> host, all connections together; 0 = unlimited

	// BootID is the sandbox's current boot id, for the egress preamble
	// (nil or "": no boot field).
	BootID func() string

	// Connect opens a data-plane stream to the guest's 127.0.0.1:port
	// (once the agent is up).
	Connect func(ctx context.Context, port uint16) (*channel.Stream, error)
	// In and Out count bytes from and to the platform; Active is called
	// on traffic (idle reclaim). Any may be nil.
	In, Out func(n int)
	Active  func()
	Log     *slog.Logger

	// uid is the peer uid both sockets must have (the process's own);
	// a test may set it.
	uid int
	// dialTimeout bounds dialling the egress socket (default 5 s).
	dialTimeout time.Duration
}

// Stats are the planes' counters.
type Stats struct {
	Conns        uint64 // connections bridged, both planes
	MS           uint64 // milliseconds they were open, summed
	Active       int    // open now
	Refused      uint64 // over max_data_conns, or of another uid
	Reaped       uint64 // data connections ended by data_idle_ms
	EgressFailed uint64 // egress connections whose socket could not be dialled
}

// Planes is a sandbox's data and egress planes.
type Planes struct {
	cfg  Config
	log  *slog.Logger
	ln   *unixsock.Listener // nil without a data plane
	rate *pace.Bucket       // nil = unlimited

	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu      sync.Mutex
	bridges map[*bridge]struct{}
	frozen  bool
	thawed  *sync.Cond
	closed  bool
	nextID  uint64

	conns, ms, refused, reaped, egressFailed atomic.Uint64
	lastWarn                                 atomic.Int64
}

// New binds the data socket (when there is a data plane): a path that
// exists and is not a stale socket is refused with an error naming it.
func New(cfg Config) (*Planes, error) {
	if cfg.MaxConns <= 0 || cfg.MaxConns > MaxConns {
		cfg.MaxConns = MaxConns
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.uid == 0 {
		cfg.uid = os.Getuid()
	}
	if cfg.dialTimeout == 0 {
		cfg.dialTimeout = 5 * time.Second
	}
	if cfg.Connect == nil {
		return nil, errors.New("plane: no Connect")
	}
	p := &Planes{cfg: cfg, log: cfg.Log, bridges: map[*bridge]struct{}{}}
	p.thawed = sync.NewCond(&p.mu)
	p.ctx, p.stop = context.WithCancel(context.Background())
	if cfg.RateKbps > 0 {
		p.rate = pace.New(cfg.RateKbps * 1000 / 8)
	}
	if cfg.DataSocket != "" && cfg.AppPort != 0 {
		ln, err := unixsock.Listen(cfg.DataSocket, "data_socket")
		if err != nil {
			p.stop()
			return nil, err
		}
		p.ln = ln
	}
	return p, nil
}

// Serve accepts data-plane connections until Close. It returns at once
// without a data plane.
func (p *Planes) Serve() {
	if p.ln == nil {
		return
	}
	for {
		c, err := p.ln.AcceptUnix()
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			p.log.Error("data plane: accept failed", "err", err)
			// EMFILE and the like: back off rather than spin.
			time.Sleep(50 * time.Millisecond)
			continue
		}
		p.admitData(c)
	}
}

// admitData checks a new data connection's peer and the cap, then
// bridges it on a goroutine of its own.
func (p *Planes) admitData(c *net.UnixConn) {
	if uid, err := unixsock.PeerUID(c); err != nil || uid != p.cfg.uid {
		p.refused.Add(1)
		p.warn("data plane: refused a connection of another user", "peer_uid", uid, "err", err)
		c.Close()
		return
	}
	b, ok := p.claim("data", "")
	if !ok {
		// Refused at once, never queued: the platform sees its
		// connection closed and can retry or shed load.
		p.refused.Add(1)
		p.warn("data plane: refused a connection over max_data_conns", "max_data_conns", p.cfg.MaxConns)
		c.Close()
		return
	}
	if !b.attach(nil, c) {
		p.release(b)
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer p.release(b)
		s, err := p.cfg.Connect(p.ctx, p.cfg.AppPort)
		if err != nil {
			p.log.Warn("data plane: opening a stream to the guest", "conn", b.id, "err", err)
			c.Close()
			return
		}
		if !b.attach(s, nil) {
			return
		}
		p.run(b, p.cfg.IdleMS)
	}()
}

// Egress bridges a guest-opened egress stream to the platform's egress
// socket: resume says the stream crossed a park (resume=1 in the
// preamble). A stream that cannot be bridged is reset, which closes the
// tenant's connection at once.
func (p *Planes) Egress(s *channel.Stream, req agentproto.Request, resume bool) {
	if p.cfg.EgressSocket == "" {
		// Counted before the reset: whoever sees the connection end
		// sees it counted (Stats, the final record).
		p.egressFailed.Add(1)
		s.Reset("the egress plane is off (no egress_socket)")
		p.warn("egress plane: a tenant connection arrived but no egress_socket is configured", "conn", req.Conn)
		return
	}
	b, ok := p.claim("egress", req.Conn)
	if !ok {
		p.refused.Add(1)
		s.Reset("too many data and egress connections")
		p.warn("egress plane: refused a connection over max_data_conns", "conn", req.Conn, "max_data_conns", p.cfg.MaxConns)
		return
	}
	if !b.attach(s, nil) {
		p.release(b)
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer p.release(b)
		c, err := p.dialEgress()
		if err != nil {
			p.egressFailed.Add(1)
			s.Reset("the platform's egress socket: " + err.Error())
			p.warn("egress plane: dialling egress_socket failed; the tenant's connection is closed", "conn", req.Conn, "err", err)
			return
		}
		if !b.attach(nil, c) {
			return
		}
		c.SetWriteDeadline(time.Now().Add(p.cfg.dialTimeout))
		boot := ""
		if p.cfg.BootID != nil {
			boot = p.cfg.BootID()
		}
		_, err = io.WriteString(c, Preamble(req.Conn, resume, boot))
		c.SetWriteDeadline(time.Time{})
		if err != nil {
			p.egressFailed.Add(1)
			s.Reset("the platform's egress socket: writing the preamble: " + err.Error())
			c.Close()
			p.warn("egress plane: writing the preamble failed", "conn", req.Conn, "err", err)
			return
		}
		p.log.Info("egress connection bridged", "conn", req.Conn, "resume", resume, "boot", boot)
		p.run(b, 0) // exempt from data_idle_ms: waiting is an egress connection's normal state
	}()
}

// dialEgress connects to the platform's egress socket and checks that it
// is served by our own user: a socket another user put at that path gets
// no tenant bytes.
func (p *Planes) dialEgress() (*net.UnixConn, error) {
	d := net.Dialer{Timeout: p.cfg.dialTimeout}
	c, err := d.DialContext(p.ctx, "unix", p.cfg.EgressSocket)
	if err != nil {
		return nil, err
	}
	uc := c.(*net.UnixConn)
	uid, err := unixsock.PeerUID(uc)
	if err != nil {
		uc.Close()
		return nil, err
	}
	if uid != p.cfg.uid {
		uc.Close()
		return nil, fmt.Errorf("%s is served by uid %d, not by nether's uid %d; refusing to send it tenant bytes", p.cfg.EgressSocket, uid, p.cfg.uid)
	}
	return uc, nil
}

// claim takes a connection slot.
func (p *Planes) claim(kind, conn string) (*bridge, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.bridges) >= p.cfg.MaxConns {
		return nil, false
	}
	p.nextID++
	b := &bridge{id: p.nextID, kind: kind, conn: conn, start: time.Now()}
	b.touch()
	p.bridges[b] = struct{}{}
	return b, true
}

func (p *Planes) release(b *bridge) {
	p.mu.Lock()
	delete(p.bridges, b)
	p.mu.Unlock()
	b.mu.Lock()
	bridged := b.stream != nil && b.host != nil
	b.mu.Unlock()
	if bridged {
		p.conns.Add(1)
		p.ms.Add(uint64(time.Since(b.start).Milliseconds()))
	}
}

// warn logs a problem a peer can cause at most once a second: a tenant
// or a platform must not be able to flood nether's log.
func (p *Planes) warn(msg string, args ...any) {
	now := time.Now().UnixNano()
	last := p.lastWarn.Load()
	if now-last >= int64(time.Second) && p.lastWarn.CompareAndSwap(last, now) {
		p.log.Warn(msg, args...)
	}
}

// Stats reads the counters.
func (p *Planes) Stats() Stats {
	p.mu.Lock()
	active := len(p.bridges)
	p.mu.Unlock()
	return Stats{Conns: p.conns.Load(), MS: p.ms.Load(), Active: active,
		Refused: p.refused.Load(), Reaped: p.reaped.Load(), EgressFailed: p.egressFailed.Load()}
}

// Busy reports whether a connection is open (activity for idle reclaim).
func (p *Planes) Busy() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.bridges) > 0
}

// Drained is nil when no bridge holds bytes on the host side (accepted
// from one end, not yet handed to the other), or names one that does:
// such bytes are host memory a park cannot carry.
func (p *Planes) Drained() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var held []string
	for b := range p.bridges {
		if n := b.held.Load(); n > 0 {
			held = append(held, fmt.Sprintf("%s connection %d%s holds %d bytes", b.kind, b.id, b.connSuffix(), n))
		}
	}
	if len(held) == 0 {
		return nil
	}
	sort.Strings(held)
	return errors.New(strings.Join(held, "; "))
}

// Freeze stops the planes handing the guest anything more (a capture is
// about to pause it): bytes read from the platform wait on the host side
// until Thaw. The other way, the channel's own freeze holds the guest's
// bytes.
func (p *Planes) Freeze() {
	p.mu.Lock()
	p.frozen = true
	p.mu.Unlock()
}

// Thaw undoes Freeze.
func (p *Planes) Thaw() {
	p.mu.Lock()
	p.frozen = false
	p.thawed.Broadcast()
	p.mu.Unlock()
}

// waitThawed blocks while the planes are frozen; false once closed.
func (p *Planes) waitThawed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.frozen && !p.closed {
		p.thawed.Wait()
	}
	return !p.closed
}

// Close stops accepting, ends every connection and waits for the bridges.
func (p *Planes) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.thawed.Broadcast()
	bs := make([]*bridge, 0, len(p.bridges))
	for b := range p.bridges {
		bs = append(bs, b)
	}
	p.mu.Unlock()
	p.stop()
	if p.ln != nil {
		p.ln.Close()
	}
	for _, b := range bs {
		b.end("the sandbox is stopping")
	}
	p.wg.Wait()
}
