package store

import (
	"encoding/json"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nethersandbox/nether/nexus/lifecycle"
)

func TestRecordsAndNames(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a := &Sandbox{ID: "01JAAAAAAAAAAAAAAAAAAAAAAA", Name: "web", State: lifecycle.Created}
	b := &Sandbox{ID: "01JBBBBBBBBBBBBBBBBBBBBBBB", State: lifecycle.Running}
	if err := s.Update(func(tx *Tx) error {
		if err := tx.PutSandbox(a); err != nil {
			return err
		}
		return tx.PutSandbox(b)
	}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ref, want string
		err       error
	}{
		{"web", a.ID, nil},
		{a.ID, a.ID, nil},
		{"01jb", b.ID, nil},
		{"01J", "", ErrNotFound}, // too short to be a prefix
		{"01JA", a.ID, nil},
		{"nope", "", ErrNotFound},
	} {
		t.Run(tc.ref, func(t *testing.T) {
			err := s.View(func(tx *Tx) error {
				got, err := tx.FindSandbox(tc.ref)
				if err != nil {
					return err
				}
				if got.ID != tc.want {
					t.Errorf("found %s, want %s", got.ID, tc.want)
				}
				return nil
			})
			if !errors.Is(err, tc.err) {
				t.Fatalf("FindSandbox(%q): %v, want %v", tc.ref, err, tc.err)
			}
		})
	}
	// A duplicate name is refused, and the transaction leaves nothing.
	err = s.Update(func(tx *Tx) error {
		return tx.PutSandbox(&Sandbox{ID: "01JCCCCCCCCCCCCCCCCCCCCCCC", Name: "web"})
	})
	if !errors.Is(err, ErrNameTaken) {
		t.Fatalf("duplicate name: %v", err)
	}
	s.View(func(tx *Tx) error {
		all, _ := tx.Sandboxes()
		if len(all) != 2 {
			t.Errorf("%d records after a refused put, want 2", len(all))
		}
		return nil
	})
	// Deleting frees the name.
	if err := s.Update(func(tx *Tx) error { return tx.DeleteSandbox(a) }); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(func(tx *Tx) error {
		return tx.PutSandbox(&Sandbox{ID: "01JCCCCCCCCCCCCCCCCCCCCCCC", Name: "web"})
	}); err != nil {
		t.Fatalf("the name of a removed sandbox: %v", err)
	}
}

func TestAmbiguousPrefix(t *testing.T) {
	s, _ := Open(t.TempDir())
	s.Update(func(tx *Tx) error {
		tx.PutSandbox(&Sandbox{ID: "01JXAAAAAAAAAAAAAAAAAAAAAA"})
		return tx.PutSandbox(&Sandbox{ID: "01JXBBBBBBBBBBBBBBBBBBBBBB"})
	})
	err := s.View(func(tx *Tx) error { _, err := tx.FindSandbox("01JX"); return err })
	if !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("an ambiguous prefix: %v", err)
	}
}

// TestConcurrentUpdates: transactions from many goroutines (standing in
// for nexus processes) each see the others' writes.
func TestConcurrentUpdates(t *testing.T) {
	s, _ := Open(t.TempDir())
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.Update(func(tx *Tx) error {
				n := tx.Meta("n")
				return tx.PutMeta("n", n+"x")
			})
			if err != nil {
				t.Errorf("update %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	s.View(func(tx *Tx) error {
		if got := tx.Meta("n"); len(got) != 20 {
			t.Errorf("%d updates landed, want 20", len(got))
		}
		return nil
	})
}

func TestLease(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name string
		l    *Lease
		live bool
	}{
		{"none", nil, false},
		{"ours, unexpired", &Lease{Holder: os.Getpid(), Expires: now.Add(time.Minute)}, true},
		{"expired", &Lease{Holder: os.Getpid(), Expires: now.Add(-time.Second)}, false},
		{"holder dead", &Lease{Holder: 1 << 30, Expires: now.Add(time.Minute)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.l.Live(now); got != tc.live {
				t.Fatalf("Live = %v, want %v", got, tc.live)
			}
		})
	}
}

// TestOlderRecordsRead: records written before the guest settings (no
// rootfs, run_as, disk_size_mb or disk) read as they meant: no disk, the
// default image, commands as root; and the new fields survive a round
// trip.
func TestOlderRecordsRead(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, raw string
		want      Config
		disk      string
	}{
		{"before disks", `{"id":"01JOLD","state":"stopped","config":{"cpus":2,"ram_mb":256,"net":true},"hostname":"old","created":"2025-01-01T00:00:00Z","updated":"2025-01-01T00:00:00Z"}`,
			Config{CPUs: 2, RAMMB: 256, Net: true}, ""},
		{"with guest settings", `{"id":"01JNEW","state":"stopped","config":{"rootfs":"busybox","run_as":"nether","disk_size_mb":32},"hostname":"new","disk":"/x/sandboxes/01JNEW/disk.img","created":"2025-01-01T00:00:00Z","updated":"2025-01-01T00:00:00Z"}`,
			Config{Rootfs: "busybox", RunAs: "nether", DiskSizeMB: 32}, "/x/sandboxes/01JNEW/disk.img"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var id struct{ ID string }
			if err := json.Unmarshal([]byte(tc.raw), &id); err != nil {
				t.Fatal(err)
			}
			if err := s.Update(func(tx *Tx) error { return tx.tx.Bucket(bSandboxes).Put([]byte(id.ID), []byte(tc.raw)) }); err != nil {
				t.Fatal(err)
			}
			var got *Sandbox
			if err := s.View(func(tx *Tx) error { got, err = tx.Sandbox(id.ID); return err }); err != nil {
				t.Fatal(err)
			}
			if got.Config != tc.want || got.Disk != tc.disk || got.Config.HasDisk() != (tc.want.DiskSizeMB > 0) {
				t.Errorf("read %+v, disk %q; want %+v, disk %q", got.Config, got.Disk, tc.want, tc.disk)
			}
			// Written back by this build and read again: the same.
			if err := s.Update(func(tx *Tx) error { return tx.PutSandbox(got) }); err != nil {
				t.Fatal(err)
			}
			var again *Sandbox
			s.View(func(tx *Tx) error { again, err = tx.Sandbox(id.ID); return err })
			if again.Config != tc.want || again.Disk != tc.disk {
				t.Errorf("after a round trip: %+v, disk %q", again.Config, again.Disk)
			}
		})
	}
}
