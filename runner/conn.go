package runner

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nethersandbox/nether/client"
)

// Info is nether's __info__ report, key by key.
type Info map[string]string

// AgentConnected says whether the guest's agent is up: commands run.
func (i Info) AgentConnected() bool { return i["agent"] == "connected" }

// Stats are __stats__'s figures (uptime_ms, cpu_ms, net_tx, data_conns, ...).
type Stats map[string]int64

// Capture is a __snapshot__'s reply.
type Capture struct {
	Path    string // as nether wrote it, relative to the launch directory
	Kind    string // "base"
	PauseMS int64  // how long the guest was paused
	RAM     string // how its memory was written
}

// Parked is a __park__'s reply: the session ended with this bill.
type Parked struct {
	Path    string
	PauseMS int64
	Bill    Stats
}

// ClaimRequest is a __claim__'s arguments: the identity a pool member
// takes, with the boot identity of the orchestrator that admitted it.
type ClaimRequest struct {
	SandboxID, Hostname               string
	NodeID, BootID, PlanDigest, Token string
}

// line is the claim's control line. Every value is one token of nether's
// identity syntax (printable, no blanks), checked here so that no value
// can carry another argument.
func (r ClaimRequest) line() (string, error) {
	words := []string{"__claim__", r.SandboxID, r.Hostname}
	for _, kv := range []struct{ k, v string }{{"node_id", r.NodeID}, {"boot_id", r.BootID}, {"token", r.Token}, {"plan_digest", r.PlanDigest}} {
		if kv.v != "" {
			words = append(words, kv.k+"="+kv.v)
		}
	}
	for _, w := range words[1:] {
		if w == "" || strings.IndexFunc(w, func(c rune) bool { return c <= ' ' || c > '~' }) >= 0 {
			return "", fmt.Errorf("__claim__: %q is not one printable word", w)
		}
	}
	return strings.Join(words, " "), nil
}

// Client is a Conn over nether's control socket, with the observe
// commands too.
type Client struct{ c *client.Client }

// DialSocket connects to the control socket at path.
func DialSocket(ctx context.Context, path string) (*Client, error) {
	c, err := client.Dial(ctx, path)
	if err != nil {
		return nil, err
	}
	return &Client{c: c}, nil
}

// DialDir connects to the control socket of the nether in dir.
func DialDir(ctx context.Context, dir string) (*Client, error) {
	return DialSocket(ctx, filepath.Join(dir, ControlSocket))
}

func (c *Client) Info() Info   { return Info(c.c.Info()) }
func (c *Client) Close() error { return c.c.Close() }

// control runs one control command that answers framed OK/ERR and
// returns its reply.
func (c *Client) control(ctx context.Context, verb, line string) (string, error) {
	var out strings.Builder
	exit, err := c.c.Run(ctx, line, &out)
	if err != nil {
		return "", failed(verb, err)
	}
	if exit != 0 {
		return "", Refusal(verb, strings.TrimSpace(out.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

func (c *Client) Stats(ctx context.Context) (Stats, error) {
	out, err := c.control(ctx, "__stats__", "__stats__")
	if err != nil {
		return nil, err
	}
	return parseStats(strings.TrimPrefix(out, "OK")), nil
}

func (c *Client) Snapshot(ctx context.Context, rel string) (Capture, error) {
	if err := oneWord("__snapshot__", rel); err != nil {
		return Capture{}, err
	}
	out, err := c.control(ctx, "__snapshot__", "__snapshot__ "+rel)
	if err != nil {
		return Capture{}, err
	}
	return parseCapture(out)
}

func (c *Client) Park(ctx context.Context, rel string) (Parked, error) {
	if err := oneWord("__park__", rel); err != nil {
		return Parked{}, err
	}
	out, err := c.control(ctx, "__park__", "__park__ "+rel)
	if err != nil {
		return Parked{}, err
	}
	return parseParked(out)
}

func (c *Client) Claim(ctx context.Context, r ClaimRequest) error {
	line, err := r.line()
	if err != nil {
		return err
	}
	_, err = c.control(ctx, "__claim__", line)
	return err
}

func (c *Client) Put(ctx context.Context, hostRel, guestPath string) error {
	if err := transferArgs("__put__", hostRel, guestPath); err != nil {
		return err
	}
	_, err := c.control(ctx, "__put__", "__put__ "+hostRel+" "+guestPath)
	return err
}

func (c *Client) Get(ctx context.Context, guestPath, hostRel string) error {
	if err := transferArgs("__get__", hostRel, guestPath); err != nil {
		return err
	}
	_, err := c.control(ctx, "__get__", "__get__ "+guestPath+" "+hostRel)
	return err
}

func (c *Client) Shutdown(ctx context.Context) error {
	_, err := c.control(ctx, "__shutdown__", "__shutdown__")
	return err
}

// Exec runs line through client.Shell: a line nether would read as its
// own verb is refused (client.ErrControlLine), never sent.
func (c *Client) Exec(ctx context.Context, line string, out io.Writer) (int, error) {
	code, err := c.c.Shell(ctx, line, out)
	if err != nil {
		return code, failed("exec", err)
	}
	return code, nil
}

// The observe commands, typed by the client package.
func (c *Client) Events(ctx context.Context, since uint64) (client.Events, error) {
	return c.c.Events(ctx, since)
}
func (c *Client) CmdLog(ctx context.Context) (client.CmdLog, error) { return c.c.CmdLog(ctx) }
func (c *Client) NetLog(ctx context.Context) (client.NetLog, error) { return c.c.NetLog(ctx) }
func (c *Client) Screen(ctx context.Context) (client.Screen, error) { return c.c.Screen(ctx) }
func (c *Client) Frame(ctx context.Context) (client.Frame, error)   { return c.c.Frame(ctx) }
func (c *Client) ScreenDiff(ctx context.Context) (client.ScreenDiff, error) {
	return c.c.ScreenDiff(ctx)
}
func (c *Client) FrameDiff(ctx context.Context) (client.FrameDiff, error) {
	return c.c.FrameDiff(ctx)
}

// transferArgs refuses arguments a transfer's control line cannot carry.
func transferArgs(verb, hostRel, guestPath string) error {
	if err := CheckGuestPath(guestPath); err != nil {
		return err
	}
	return oneWord(verb, hostRel)
}

// oneWord refuses a host path the control line would split or end.
func oneWord(verb, p string) error {
	if p == "" || strings.ContainsAny(p, " \t\r\n\v\f\x00\x1e\x1f") {
		return fmt.Errorf("%s: host path %q: %w", verb, p, ErrBadPath)
	}
	return nil
}

// parseStats reads key=value figures, skipping any other word.
func parseStats(line string) Stats {
	out := Stats{}
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			out[k] = n
		}
	}
	return out
}

// parseCapture reads "OK snapshot <path> kind=base pause_ms=N ram=<mode>".
func parseCapture(reply string) (Capture, error) {
	f := strings.Fields(reply)
	if len(f) < 3 || f[0] != "OK" || f[1] != "snapshot" {
		return Capture{}, fmt.Errorf("__snapshot__: unexpected reply %.80q", reply)
	}
	c := Capture{Path: f[2]}
	for _, w := range f[3:] {
		k, v, _ := strings.Cut(w, "=")
		switch k {
		case "kind":
			c.Kind = v
		case "ram":
			c.RAM = v
		case "pause_ms":
			c.PauseMS, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return c, nil
}

// parseParked reads "OK parked <path> pause_ms=N <the bill's figures>".
func parseParked(reply string) (Parked, error) {
	f := strings.Fields(reply)
	if len(f) < 3 || f[0] != "OK" || f[1] != "parked" {
		return Parked{}, fmt.Errorf("__park__: unexpected reply %.80q", reply)
	}
	p := Parked{Path: f[2], Bill: parseStats(strings.Join(f[3:], " "))}
	p.PauseMS = p.Bill["pause_ms"]
	delete(p.Bill, "pause_ms")
	return p, nil
}
