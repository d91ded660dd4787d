package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// auditStore is a store with n records in its chain.
func auditStore(t *testing.T, n int) *Store {
	t.Helper()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		if err := s.Update(func(tx *Tx) error {
			return tx.AppendAudit(&AuditRecord{Event: "fork", Outcome: "ok", Sandbox: fmt.Sprintf("sb%d", i%3), Parent: "p"})
		}); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func TestAuditChainVerifies(t *testing.T) {
	s := auditStore(t, 5)
	var head AuditHead
	err := s.View(func(tx *Tx) error {
		var err error
		head, err = tx.VerifyAudit()
		return err
	})
	if err != nil || head.Records != 5 || len(head.Hash) != 64 {
		t.Fatalf("VerifyAudit = %+v, %v", head, err)
	}
	s.View(func(tx *Tx) error {
		all, _ := tx.Audit("")
		one, _ := tx.Audit("sb1")
		if len(all) != 5 || len(one) != 2 || all[0].Seq != 1 || all[0].Prev != "" || all[1].Prev == "" {
			t.Fatalf("Audit: %d records, %d of sb1; first %+v", len(all), len(one), all[0])
		}
		return nil
	})
	// An empty chain verifies too.
	empty := auditStore(t, 0)
	if err := empty.View(func(tx *Tx) error { _, err := tx.VerifyAudit(); return err }); err != nil {
		t.Fatalf("an empty chain: %v", err)
	}
}

// Every way of damaging the chain is caught, naming the first bad record.
func TestAuditChainCatchesDamage(t *testing.T) {
	cases := []struct {
		name   string
		damage func(tx *Tx) error
		want   string
	}{
		{"a field altered", func(tx *Tx) error {
			raw := strings.Replace(string(tx.rawAudit(3)), `"outcome":"ok"`, `"outcome":"no"`, 1)
			return tx.tx.Bucket(bAudit).Put(auditKey(3), []byte(raw))
		}, "record 4 does not follow record 3 (record 3 was altered)"},
		{"a record removed", func(tx *Tx) error {
			return tx.tx.Bucket(bAudit).Delete(auditKey(2))
		}, "record 2 is missing"},
		{"the last record removed", func(tx *Tx) error {
			return tx.tx.Bucket(bAudit).Delete(auditKey(5))
		}, "records 5-5 removed"},
		{"the last record altered", func(tx *Tx) error {
			var r AuditRecord
			json.Unmarshal(tx.rawAudit(5), &r)
			r.Detail = "rewritten"
			raw, _ := json.Marshal(r)
			return tx.tx.Bucket(bAudit).Put(auditKey(5), raw)
		}, "record 5 does not match the chain's head"},
		{"a record renumbered", func(tx *Tx) error {
			raw := strings.Replace(string(tx.rawAudit(4)), `"seq":4`, `"seq":9`, 1)
			return tx.tx.Bucket(bAudit).Put(auditKey(4), []byte(raw))
		}, "record 4 says it is record 9"},
		{"garbage", func(tx *Tx) error {
			return tx.tx.Bucket(bAudit).Put(auditKey(1), []byte("{not json"))
		}, "record 1 is not a record"},
		{"the head damaged", func(tx *Tx) error {
			return tx.PutMeta(metaAuditHead, "x")
		}, "its head \"x\" is damaged"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := auditStore(t, 5)
			if err := s.Update(c.damage); err != nil {
				t.Fatal(err)
			}
			err := s.View(func(tx *Tx) error { _, err := tx.VerifyAudit(); return err })
			if !errors.Is(err, ErrAuditBroken) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("VerifyAudit: %v, want ErrAuditBroken saying %q", err, c.want)
			}
		})
	}
}

// Appends after a verified chain keep it whole, in one transaction or
// many.
func TestAuditAppendMany(t *testing.T) {
	s := auditStore(t, 2)
	recs := make([]*AuditRecord, 100)
	for i := range recs {
		recs[i] = &AuditRecord{Event: "boot", Outcome: "ok"}
	}
	if err := s.Update(func(tx *Tx) error { return tx.AppendAudit(recs...) }); err != nil {
		t.Fatal(err)
	}
	err := s.View(func(tx *Tx) error {
		head, err := tx.VerifyAudit()
		if err == nil && head.Records != 102 {
			err = fmt.Errorf("%d records", head.Records)
		}
		return err
	})
	if err != nil || recs[99].Seq != 102 {
		t.Fatalf("after appending 100: %v (last seq %d)", err, recs[99].Seq)
	}
}

// rawAudit is for tests that damage the chain on purpose.
func (t *Tx) rawAudit(seq uint64) []byte {
	if b := t.bucket(bAudit); b != nil {
		return bytes.Clone(b.Get(auditKey(seq)))
	}
	return nil
}
