package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// qmpCallTimeout bounds one QMP command. Every command we send answers in
// milliseconds on a healthy QEMU (migrations are polled, not awaited).
const qmpCallTimeout = 10 * time.Second

// qmp is a minimal QMP client: commands with ids, replies matched by id,
// events handed to a callback. QEMU is trusted less than our own code but
// more than the guest; we still bound what we read.
type qmp struct {
	conn    net.Conn
	wmu     sync.Mutex // one command on the wire at a time
	mu      sync.Mutex
	nextID  int
	pending map[string]chan qmpReply
	onEvent func(name string, data json.RawMessage)
	done    chan struct{}
	err     error
}

type qmpReply struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
}

type qmpMessage struct {
	QMP   json.RawMessage `json:"QMP"`
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data"`
	ID    string          `json:"id"`
	qmpReply
}

// QMPVersion is what the greeting reports.
type qmpGreeting struct {
	Version struct {
		Qemu struct{ Major, Minor, Micro int } `json:"qemu"`
	} `json:"version"`
}

func newQMP(ctx context.Context, conn net.Conn, onEvent func(string, json.RawMessage)) (*qmp, string, error) {
	q := &qmp{conn: conn, pending: map[string]chan qmpReply{}, onEvent: onEvent, done: make(chan struct{})}
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	// The greeting is bounded too: a QEMU that connects and says nothing
	// must not hang a start.
	if dl, ok := ctx.Deadline(); ok {
		conn.SetReadDeadline(dl)
	} else {
		conn.SetReadDeadline(time.Now().Add(qmpCallTimeout))
	}
	ok := sc.Scan()
	conn.SetReadDeadline(time.Time{})
	if !ok {
		return nil, "", fmt.Errorf("reading QMP greeting: %v", sc.Err())
	}
	var g struct {
		QMP qmpGreeting `json:"QMP"`
	}
	if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
		return nil, "", fmt.Errorf("decoding QMP greeting: %w", err)
	}
	v := g.QMP.Version.Qemu
	version := fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro)
	go q.readLoop(sc)
	if _, err := q.execute(ctx, "qmp_capabilities", nil); err != nil {
		return nil, "", fmt.Errorf("QMP capabilities negotiation: %w", err)
	}
	return q, version, nil
}

func (q *qmp) readLoop(sc *bufio.Scanner) {
	for sc.Scan() {
		var m qmpMessage
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			continue
		}
		if m.Event != "" {
			if q.onEvent != nil {
				q.onEvent(m.Event, m.Data)
			}
			continue
		}
		q.mu.Lock()
		ch := q.pending[m.ID]
		delete(q.pending, m.ID)
		q.mu.Unlock()
		if ch != nil {
			ch <- m.qmpReply
		}
	}
	q.mu.Lock()
	q.err = fmt.Errorf("QMP connection closed: %v", sc.Err())
	q.mu.Unlock()
	close(q.done)
}

// execute runs a QMP command and returns its "return" value.
func (q *qmp) execute(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	return q.executeFD(ctx, cmd, args, nil)
}

// executeFD runs a command with a file descriptor attached (SCM_RIGHTS),
// as getfd expects: QEMU then owns a duplicate of f.
func (q *qmp) executeFD(ctx context.Context, cmd string, args any, f *os.File) (json.RawMessage, error) {
	// Every call has a deadline: a wedged QEMU (stopped, or stuck in a
	// device) must never hold the session forever.
	ctx, cancel := context.WithTimeout(ctx, qmpCallTimeout)
	defer cancel()
	q.mu.Lock()
	q.nextID++
	id := fmt.Sprintf("n%d", q.nextID)
	ch := make(chan qmpReply, 1)
	q.pending[id] = ch
	q.mu.Unlock()
	req := map[string]any{"execute": cmd, "id": id}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	b = append(b, '\n')
	if f != nil {
		uc, ok := q.conn.(*net.UnixConn)
		if !ok {
			return nil, fmt.Errorf("QMP %s: passing a file needs a unix socket", cmd)
		}
		q.wmu.Lock()
		_, _, err = uc.WriteMsgUnix(b, unix.UnixRights(int(f.Fd())), nil)
		q.wmu.Unlock()
	} else {
		q.wmu.Lock()
		_, err = q.conn.Write(b)
		q.wmu.Unlock()
	}
	if err != nil {
		q.mu.Lock()
		delete(q.pending, id)
		q.mu.Unlock()
		return nil, fmt.Errorf("QMP %s: %w", cmd, err)
	}
	select {
	case r := <-ch:
		if r.Error != nil {
			return nil, fmt.Errorf("QMP %s: %s: %s", cmd, r.Error.Class, r.Error.Desc)
		}
		return r.Return, nil
	case <-q.done:
		return nil, fmt.Errorf("QMP %s: %w", cmd, q.err)
	case <-ctx.Done():
		q.mu.Lock()
		delete(q.pending, id)
		q.mu.Unlock()
		return nil, fmt.Errorf("QMP %s: %w", cmd, ctx.Err())
	}
}
