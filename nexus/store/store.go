// Package store is nexus's records: sandboxes, snapshots and pools, in a
// bbolt database under the state directory. The database is opened for
// each transaction and closed after it, never held: two nexus commands
// (or a command and `nexus serve`) take turns on it, and a long operation
// such as a 16-way fork holds a lease on its records (Lease) instead of
// the database.
package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/nethersandbox/nether/nexus/lifecycle"
)

// Buckets.
var (
	bSandboxes = []byte("sandboxes")
	bSnapshots = []byte("snapshots")
	bNames     = []byte("names") // "sandbox/<name>" and "snapshot/<name>" -> id
	bPools     = []byte("pools") // snapshot id -> Pool
	bMeta      = []byte("meta")
)

// Errors, for errors.Is.
var (
	ErrNotFound  = errors.New("not found")
	ErrNameTaken = errors.New("name taken")
	ErrAmbiguous = errors.New("ambiguous")
)

// Records are JSON and carry no format version: a field is only ever
// added, with omitempty and a zero value that means what a record
// written before it meant (no disk, the default root image, commands as
// root), so every older record reads as it was written. A change that
// cannot be made that way needs a version in the meta bucket first.

// Config is what a sandbox's nether runs with: the settings a user gives
// `nexus create` (and a fork inherits).
type Config struct {
	CPUs         int    `json:"cpus,omitempty"`
	RAMMB        int    `json:"ram_mb,omitempty"`
	Net          bool   `json:"net,omitempty"`
	NetAllow     string `json:"net_allow,omitempty"`
	NetBlock     string `json:"net_block,omitempty"`
	MaxRuntimeS  int64  `json:"max_runtime_s,omitempty"`
	MaxCPUS      int64  `json:"max_cpu_s,omitempty"`
	IdleTimeoutS int64  `json:"idle_timeout_s,omitempty"`
	AppPort      int    `json:"app_port,omitempty"`
	EgressPort   int    `json:"egress_port,omitempty"`
	GPU          bool   `json:"gpu,omitempty"`
	// Rootfs is the guest's root image: "" the default image setup
	// built, "busybox" the initramfs alone, else an absolute path.
	Rootfs string `json:"rootfs,omitempty"`
	// RunAs is the guest user every command runs as ("" = root).
	RunAs string `json:"run_as,omitempty"`
	// DiskSizeMB > 0 gives the sandbox a persistent disk at /data of
	// this size; 0 = no disk.
	DiskSizeMB int `json:"disk_size_mb,omitempty"`
}

// HasDisk says whether the settings give the sandbox a persistent disk.
func (c Config) HasDisk() bool { return c.DiskSizeMB > 0 }

// Lease is an operation's hold on a record: another operation on the same
// record waits for it or fails, and a lease whose holder died (or that
// expired) is taken over.
type Lease struct {
	Op      string    `json:"op"`
	Holder  int       `json:"holder"` // the nexus process's pid
	Expires time.Time `json:"expires"`
}

// Live says whether the lease still holds at now.
func (l *Lease) Live(now time.Time) bool {
	return l != nil && now.Before(l.Expires) && processAlive(l.Holder)
}

// Sandbox is one sandbox's record.
type Sandbox struct {
	ID       string          `json:"id"`
	Name     string          `json:"name,omitempty"`
	State    lifecycle.State `json:"state"`
	Config   Config          `json:"config"`
	Hostname string          `json:"hostname"`
	// Provenance: the sandbox it was forked from and the snapshot it was
	// restored from ("" for a sandbox that was created).
	Parent   string `json:"parent,omitempty"`
	Snapshot string `json:"snapshot,omitempty"`
	// Pool is the snapshot whose warm pool holds it, until it is claimed.
	Pool    string    `json:"pool,omitempty"`
	Created time.Time `json:"created"`
	Updated time.Time `json:"updated"`
	// The running nether: its pid and the start time the kernel gave it
	// (so a reused pid is not taken for it).
	PID      int    `json:"pid,omitempty"`
	PIDStart uint64 `json:"pid_start,omitempty"`
	// Park is the artifact a paused sandbox wakes from.
	Park string `json:"park,omitempty"`
	// Disk is the host file of its persistent disk ("" = none), in its
	// own directory: disk.img for a sandbox that was created, disk.qcow2
	// (a copy-on-write layer over its snapshot's disk) for a fork. It
	// outlives stop and start, and goes with the sandbox's rm.
	Disk string `json:"disk,omitempty"`
	// Plan is the digest of the signed plan that admitted its current
	// (or last) run; "" for a sandbox run without admission.
	Plan string `json:"plan,omitempty"`
	// Boot is the boot id of its current (or last) run: new for every
	// boot, restore, wake and claim.
	Boot string `json:"boot,omitempty"`
	// Secrets are the names (never the values) of the secrets its
	// current run holds: what its start, fork or wake delivered.
	Secrets []string `json:"secrets,omitempty"`
	// Final is the final usage record of its last session; Reason says
	// why it is in error.
	Final  string `json:"final,omitempty"`
	Reason string `json:"reason,omitempty"`
	Lease  *Lease `json:"lease,omitempty"`
}

// Ref is how messages name the sandbox: its name, else its id.
func (s *Sandbox) Ref() string {
	if s.Name != "" {
		return s.Name
	}
	return s.ID
}

// Snapshot is one artifact in the store.
type Snapshot struct {
	ID      string    `json:"id"`
	Name    string    `json:"name,omitempty"`
	Source  string    `json:"source"` // the sandbox it was taken of
	Config  Config    `json:"config"` // its settings, which its forks take
	Dir     string    `json:"dir"`
	Digest  string    `json:"digest"` // sha256 of the artifact's meta.json, which pins every file
	Size    int64     `json:"size"`   // bytes on disk
	Created time.Time `json:"created"`
	// Refs are the sandboxes that depend on it (their memory is mapped
	// from it): it cannot be removed while any is listed.
	Refs []string `json:"refs,omitempty"`
	// Plan is the digest of the plan its source ran under at the capture
	// ("" unadmitted): a fork's plan must descend from it.
	Plan string `json:"plan,omitempty"`
	// Class is "clean" (nothing of a tenant's: any admitted plan may
	// fork it) or "dirty" (its lineage's only); "" in older records,
	// which are dirty.
	Class string `json:"class,omitempty"`
	Lease *Lease `json:"lease,omitempty"`
}

// Ref is how messages name the snapshot.
func (s *Snapshot) Ref() string {
	if s.Name != "" {
		return s.Name
	}
	return s.ID
}

// Pool is a warm pool: Size children of Snapshot kept restored.
type Pool struct {
	Snapshot string `json:"snapshot"`
	Size     int    `json:"size"`
}

// Store is the database at Path.
type Store struct {
	Path string
	// Timeout bounds the wait for another nexus's transaction.
	Timeout time.Duration
}

// Open returns the store in dir, creating dir and the database.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the state directory: %w", err)
	}
	s := &Store{Path: filepath.Join(dir, "nexus.db"), Timeout: 10 * time.Second}
	if err := s.Update(func(*Tx) error { return nil }); err != nil {
		return nil, err
	}
	return s, nil
}

// Tx is one transaction.
type Tx struct {
	tx *bolt.Tx
}

func (s *Store) open(readOnly bool) (*bolt.DB, error) {
	if readOnly {
		if _, err := os.Stat(s.Path); err != nil {
			readOnly = false // the first use creates it
		}
	}
	db, err := bolt.Open(s.Path, 0o600, &bolt.Options{Timeout: s.Timeout, ReadOnly: readOnly})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("the nexus store %s is held by another nexus for more than %s", s.Path, s.Timeout)
		}
		return nil, fmt.Errorf("opening the nexus store %s: %w", s.Path, err)
	}
	return db, nil
}

// View runs fn in a read-only transaction.
func (s *Store) View(fn func(*Tx) error) error {
	db, err := s.open(true)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.View(func(tx *bolt.Tx) error { return fn(&Tx{tx: tx}) })
}

// Update runs fn in a read-write transaction: all of it happens or none.
func (s *Store) Update(fn func(*Tx) error) error {
	db, err := s.open(false)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bSandboxes, bSnapshots, bNames, bPools, bMeta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return fn(&Tx{tx: tx})
	})
}

func (t *Tx) bucket(name []byte) *bolt.Bucket {
	b := t.tx.Bucket(name)
	if b == nil {
		// A read-only transaction on a database no Update has seen.
		return nil
	}
	return b
}

func get[T any](t *Tx, bucket []byte, id string) (*T, error) {
	b := t.bucket(bucket)
	if b == nil {
		return nil, ErrNotFound
	}
	raw := b.Get([]byte(id))
	if raw == nil {
		return nil, ErrNotFound
	}
	v := new(T)
	if err := json.Unmarshal(raw, v); err != nil {
		return nil, fmt.Errorf("record %s in %s is damaged: %w", id, bucket, err)
	}
	return v, nil
}

func put(t *Tx, bucket []byte, id string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return t.tx.Bucket(bucket).Put([]byte(id), raw)
}

func all[T any](t *Tx, bucket []byte) ([]*T, error) {
	b := t.bucket(bucket)
	if b == nil {
		return nil, nil
	}
	var out []*T
	err := b.ForEach(func(k, raw []byte) error {
		v := new(T)
		if err := json.Unmarshal(raw, v); err != nil {
			return fmt.Errorf("record %s in %s is damaged: %w", k, bucket, err)
		}
		out = append(out, v)
		return nil
	})
	return out, err
}

// Sandbox reads one sandbox by id.
func (t *Tx) Sandbox(id string) (*Sandbox, error) { return get[Sandbox](t, bSandboxes, id) }

// Sandboxes reads every sandbox, oldest first (ULIDs sort by time).
func (t *Tx) Sandboxes() ([]*Sandbox, error) { return all[Sandbox](t, bSandboxes) }

// PutSandbox writes a sandbox, claiming its name (a name another record
// holds is ErrNameTaken) and stamping Updated.
func (t *Tx) PutSandbox(s *Sandbox) error {
	if err := t.claimName("sandbox", s.Name, s.ID); err != nil {
		return err
	}
	s.Updated = time.Now().UTC()
	return put(t, bSandboxes, s.ID, s)
}

// DeleteSandbox removes a sandbox and its name.
func (t *Tx) DeleteSandbox(s *Sandbox) error {
	if s.Name != "" {
		if err := t.tx.Bucket(bNames).Delete([]byte("sandbox/" + s.Name)); err != nil {
			return err
		}
	}
	return t.tx.Bucket(bSandboxes).Delete([]byte(s.ID))
}

// Snapshot reads one snapshot by id.
func (t *Tx) Snapshot(id string) (*Snapshot, error) { return get[Snapshot](t, bSnapshots, id) }

// Snapshots reads every snapshot, oldest first.
func (t *Tx) Snapshots() ([]*Snapshot, error) { return all[Snapshot](t, bSnapshots) }

// PutSnapshot writes a snapshot, claiming its name.
func (t *Tx) PutSnapshot(s *Snapshot) error {
	if err := t.claimName("snapshot", s.Name, s.ID); err != nil {
		return err
	}
	return put(t, bSnapshots, s.ID, s)
}

// DeleteSnapshot removes a snapshot record and its name.
func (t *Tx) DeleteSnapshot(s *Snapshot) error {
	if s.Name != "" {
		if err := t.tx.Bucket(bNames).Delete([]byte("snapshot/" + s.Name)); err != nil {
			return err
		}
	}
	return t.tx.Bucket(bSnapshots).Delete([]byte(s.ID))
}

// Pools reads every pool.
func (t *Tx) Pools() ([]*Pool, error) { return all[Pool](t, bPools) }

// PutPool sets a pool; size 0 removes it.
func (t *Tx) PutPool(p *Pool) error {
	if p.Size == 0 {
		return t.tx.Bucket(bPools).Delete([]byte(p.Snapshot))
	}
	return put(t, bPools, p.Snapshot, p)
}

// Meta reads a value of the store's own (the node id, say).
func (t *Tx) Meta(key string) string {
	b := t.bucket(bMeta)
	if b == nil {
		return ""
	}
	return string(b.Get([]byte(key)))
}

// PutMeta writes a value of the store's own.
func (t *Tx) PutMeta(key, value string) error {
	return t.tx.Bucket(bMeta).Put([]byte(key), []byte(value))
}

func (t *Tx) claimName(kind, name, id string) error {
	if name == "" {
		return nil
	}
	key := []byte(kind + "/" + name)
	b := t.tx.Bucket(bNames)
	if owner := b.Get(key); owner != nil && !bytes.Equal(owner, []byte(id)) {
		return fmt.Errorf("%w: a %s named %q already exists (%s)", ErrNameTaken, kind, name, owner)
	}
	return b.Put(key, []byte(id))
}

// FindSandbox resolves what a user typed: a name, an id, or a unique
// prefix of an id (at least 4 characters).
func (t *Tx) FindSandbox(ref string) (*Sandbox, error) {
	id, err := t.resolve("sandbox", bSandboxes, ref)
	if err != nil {
		return nil, err
	}
	return t.Sandbox(id)
}

// FindSnapshot resolves a snapshot's name, id or id prefix.
func (t *Tx) FindSnapshot(ref string) (*Snapshot, error) {
	id, err := t.resolve("snapshot", bSnapshots, ref)
	if err != nil {
		return nil, err
	}
	return t.Snapshot(id)
}

func (t *Tx) resolve(kind string, bucket []byte, ref string) (string, error) {
	if ref == "" {
		return "", fmt.Errorf("%w: no %s named", ErrNotFound, kind)
	}
	if names := t.bucket(bNames); names != nil {
		if id := names.Get([]byte(kind + "/" + ref)); id != nil {
			return string(id), nil
		}
	}
	b := t.bucket(bucket)
	if b == nil {
		return "", fmt.Errorf("%w: no %s %q", ErrNotFound, kind, ref)
	}
	if b.Get([]byte(ref)) != nil {
		return ref, nil
	}
	up := strings.ToUpper(ref)
	if len(up) >= 4 {
		var hits []string
		c := b.Cursor()
		for k, _ := c.Seek([]byte(up)); k != nil && bytes.HasPrefix(k, []byte(up)); k, _ = c.Next() {
			hits = append(hits, string(k))
		}
		switch len(hits) {
		case 1:
			return hits[0], nil
		case 0:
		default:
			sort.Strings(hits)
			return "", fmt.Errorf("%w: %q is the start of %d %s ids (%s, ...); give more of it", ErrAmbiguous, ref, len(hits), kind, hits[0])
		}
	}
	return "", fmt.Errorf("%w: no %s named or with id %q", ErrNotFound, kind, ref)
}
