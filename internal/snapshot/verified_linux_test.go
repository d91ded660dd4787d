//go:build linux

package snapshot

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func settled(t *testing.T) *VerifiedCache {
	return &VerifiedCache{Dir: filepath.Join(t.TempDir(), "verified")}
}

// cleared makes an artifact and waits until its files' stamps are clear
// of the clock tick they were written on (FileStamp.ClearAt), as an
// artifact a restore meets usually is.
func cleared(t *testing.T, dir, name string) string {
	t.Helper()
	art := makeArtifact(t, dir, name, KindBase, RAMFile)
	time.Sleep(30 * time.Millisecond)
	return art
}

func verifyCached(t *testing.T, art string, c *VerifiedCache) (bool, error) {
	t.Helper()
	a, err := Open(art)
	if err != nil {
		t.Fatal(err)
	}
	return a.VerifyCached(context.Background(), c)
}

func TestVerifiedCache(t *testing.T) {
	ram := func(art string) string { return filepath.Join(art, "ram") }
	dataOff := ramExtents[0].off + 10

	t.Run("an unchanged artifact is not read again", func(t *testing.T) {
		c := settled(t)
		art := cleared(t, t.TempDir(), "base")
		for i, want := range []bool{false, true, true} {
			got, err := verifyCached(t, art, c)
			if err != nil || got != want {
				t.Fatalf("verification %d: remembered=%v err=%v, want remembered=%v", i+1, got, err, want)
			}
		}
	})

	// Every change through the file system moves the ctime, which no
	// unprivileged process can set back: the next restore verifies in full.
	damage := []struct {
		name string
		do   func(t *testing.T, art string)
	}{
		{"a flipped byte", func(t *testing.T, art string) { flipByte(t, ram(art), dataOff) }},
		{"a flipped byte with its mtime set back", func(t *testing.T, art string) {
			st, err := os.Stat(ram(art))
			if err != nil {
				t.Fatal(err)
			}
			flipByte(t, ram(art), dataOff)
			if err := os.Chtimes(ram(art), st.ModTime(), st.ModTime()); err != nil {
				t.Fatal(err)
			}
		}},
		{"a file replaced by a damaged copy", func(t *testing.T, art string) {
			b, err := os.ReadFile(ram(art))
			if err != nil {
				t.Fatal(err)
			}
			b[dataOff] ^= 1
			tmp := filepath.Join(art, "ram.new")
			writeFile(t, tmp, b)
			if err := os.Rename(tmp, ram(art)); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, d := range damage {
		t.Run(d.name+" is found", func(t *testing.T) {
			c := settled(t)
			art := cleared(t, t.TempDir(), "base")
			if _, err := verifyCached(t, art, c); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond) // past the coarse clock's tick
			d.do(t, art)
			remembered, err := verifyCached(t, art, c)
			if remembered || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("after %s: remembered=%v err=%v, want a full verification that finds it", d.name, remembered, err)
			}
		})
	}

	t.Run("a file changed just before is not remembered", func(t *testing.T) {
		c := settled(t)
		c.Settle = time.Hour
		art := cleared(t, t.TempDir(), "base")
		for i := range 2 {
			if got, err := verifyCached(t, art, c); err != nil || got {
				t.Fatalf("verification %d: remembered=%v err=%v, want a full one", i+1, got, err)
			}
		}
		if _, err := os.Stat(c.Dir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a record was written for a file changed within Settle: %v", err)
		}
	})

	t.Run("a directory others can write is not trusted", func(t *testing.T) {
		c := settled(t)
		art := cleared(t, t.TempDir(), "base")
		if _, err := verifyCached(t, art, c); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(c.Dir, 0o777); err != nil {
			t.Fatal(err)
		}
		if got, err := verifyCached(t, art, c); err != nil || got {
			t.Fatalf("remembered=%v err=%v, want a full verification", got, err)
		}
	})

	t.Run("a damaged record is ignored", func(t *testing.T) {
		c := settled(t)
		art := cleared(t, t.TempDir(), "base")
		if _, err := verifyCached(t, art, c); err != nil {
			t.Fatal(err)
		}
		recs, _ := filepath.Glob(filepath.Join(c.Dir, "*"))
		if len(recs) != 1 {
			t.Fatalf("records: %v, want one", recs)
		}
		writeFile(t, recs[0], []byte("{not json"))
		if got, err := verifyCached(t, art, c); err != nil || got {
			t.Fatalf("remembered=%v err=%v, want a full verification", got, err)
		}
		if got, err := verifyCached(t, art, c); err != nil || !got {
			t.Fatalf("remembered=%v err=%v, want the record rewritten", got, err)
		}
	})

	t.Run("the oldest records go", func(t *testing.T) {
		c := settled(t)
		c.Max = 2
		dir := t.TempDir()
		for _, name := range []string{"a", "b", "c"} {
			if _, err := verifyCached(t, cleared(t, dir, name), c); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		recs, _ := filepath.Glob(filepath.Join(c.Dir, "*"))
		if len(recs) != 2 {
			t.Fatalf("records: %v, want the newest two", recs)
		}
		if got, err := verifyCached(t, filepath.Join(dir, "c"), c); err != nil || !got {
			t.Fatalf("the newest: remembered=%v err=%v", got, err)
		}
		if got, err := verifyCached(t, filepath.Join(dir, "a"), c); err != nil || got {
			t.Fatalf("the oldest: remembered=%v err=%v, want it pruned", got, err)
		}
	})

	t.Run("Verify always reads everything", func(t *testing.T) {
		c := settled(t)
		art := cleared(t, t.TempDir(), "base")
		a, err := Open(art)
		if err != nil {
			t.Fatal(err)
		}
		// Bit rot under the file system leaves every stamp as it was.
		// Simulated by damage made first and a record made to match it:
		// the cache trusts the record, a full verification does not.
		flipByte(t, ram(art), dataOff)
		time.Sleep(20 * time.Millisecond)
		stamps := map[string]FileStamp{}
		for name := range a.Meta.Files {
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(art, name), &st); err != nil {
				t.Fatal(err)
			}
			stamps[name] = stampOf(&st)
		}
		if err := c.write(a.metaSum, stamps, time.Now()); err != nil {
			t.Fatal(err)
		}
		if got, err := a.VerifyCached(context.Background(), c); err != nil || !got {
			t.Fatalf("VerifyCached: remembered=%v err=%v, want the record trusted", got, err)
		}
		if err := a.Verify(context.Background()); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Verify: %v, want the damage found", err)
		}
	})
}

// A stamp is clear of a change one clock tick after it on a file system
// of nanoseconds, two seconds after it on one of whole seconds.
func TestFileStampClearAt(t *testing.T) {
	base := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name         string
		ctime, mtime time.Time
		want         time.Time
	}{
		{"nanoseconds", base.Add(123456789), base.Add(5), base.Add(123456789 + 20*time.Millisecond)},
		{"whole seconds", base, base, base.Add(2 * time.Second)},
		{"the later of ctime and mtime", base.Add(7), base.Add(3 * time.Second).Add(9), base.Add(3 * time.Second).Add(9 + 20*time.Millisecond)},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := FileStamp{CtimeNS: c.ctime.UnixNano(), MtimeNS: c.mtime.UnixNano()}
			if got := s.ClearAt(); !got.Equal(c.want) {
				t.Fatalf("ClearAt = %s, want %s", got, c.want)
			}
		})
	}
}
