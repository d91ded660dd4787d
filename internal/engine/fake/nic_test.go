package fake

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/engine"
)

// exchange writes one frame at each end of a NIC and checks the other
// end reads it whole.
func exchange(t *testing.T, host, guest *os.File) {
	t.Helper()
	buf := make([]byte, 2048)
	for _, tc := range []struct {
		name     string
		from, to *os.File
		frame    []byte
	}{
		{"guest to host", guest, host, []byte("\xff\xff\xff\xff\xff\xff\x52\x54\x00\x12\x34\x56\x08\x06" + strings.Repeat("a", 46))},
		{"host to guest", host, guest, []byte("\x52\x54\x00\x12\x34\x56\x52\x54\x00\x12\x35\x02\x08\x00" + strings.Repeat("b", 1500))},
	} {
		if _, err := tc.from.Write(tc.frame); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		n, err := tc.to.Read(buf)
		if err != nil || string(buf[:n]) != string(tc.frame) {
			t.Fatalf("%s: read %d bytes, %v; want the %d-byte frame", tc.name, n, err, len(tc.frame))
		}
	}
}

func TestNIC(t *testing.T) {
	for _, tc := range []struct {
		name string
		nic  bool
	}{{"without", false}, {"with", true}} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := boot(t, New(slog.Default()), engine.Spec{NIC: tc.nic})
			if (m.NIC() != nil) != tc.nic || (m.GuestNIC() != nil) != tc.nic {
				t.Fatalf("NIC %v, GuestNIC %v; want them only with Spec.NIC", m.NIC(), m.GuestNIC())
			}
			if tc.nic {
				exchange(t, m.NIC(), m.GuestNIC())
			}
		})
	}
}

// TestNICEnds: a reader blocked on the host end returns once the
// machine ends, as it does when QEMU exits.
func TestNICEnds(t *testing.T) {
	m, _ := boot(t, New(slog.Default()), engine.Spec{NIC: true})
	nic := m.NIC()
	got := make(chan error, 1)
	go func() {
		_, err := nic.Read(make([]byte, 2048))
		got <- err
	}()
	time.Sleep(10 * time.Millisecond)
	m.Quit(context.Background())
	select {
	case err := <-got:
		if err != io.EOF && !errors.Is(err, os.ErrClosed) {
			t.Fatalf("read on a NIC whose machine ended: %v, want EOF or a closed file", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a read on the NIC outlived its machine")
	}
}

// TestNICCapture: a restored machine gets a NIC of its own, and a
// restore with another device set is refused naming net, as QEMU's is.
func TestNICCapture(t *testing.T) {
	e := New(slog.Default())
	ctx := context.Background()
	capture := func(spec engine.Spec) *engine.Incoming {
		m, _ := boot(t, e, spec)
		if err := m.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		cap, err := m.Capture(ctx, dirSink(dir))
		if err != nil {
			t.Fatal(err)
		}
		return &engine.Incoming{Dir: dir, Section: cap.Section}
	}
	withNIC, without := capture(engine.Spec{NIC: true}), capture(engine.Spec{})
	for _, tc := range []struct {
		name    string
		in      *engine.Incoming
		nic     bool
		wantErr string
	}{
		{"NIC both ways", withNIC, true, ""},
		{"no NIC both ways", without, false, ""},
		{"captured with a NIC, restored without", withNIC, false, "captured with net = 1 and this sandbox has net = 0"},
		{"captured without a NIC, restored with", without, true, "captured with net = 0 and this sandbox has net = 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := e.Start(ctx, engine.Spec{Incoming: tc.in, NIC: tc.nic})
			if tc.wantErr != "" {
				if !errors.Is(err, engine.ErrDeviceMismatch) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want ErrDeviceMismatch containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer r.Quit(ctx)
			if err := r.LoadIncoming(ctx); err != nil {
				t.Fatal(err)
			}
			if (r.NIC() != nil) != tc.nic {
				t.Fatalf("restored NIC %v, want one: %v", r.NIC(), tc.nic)
			}
			if tc.nic {
				exchange(t, r.NIC(), r.(*Machine).GuestNIC())
			}
		})
	}
}
