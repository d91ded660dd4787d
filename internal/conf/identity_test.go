package conf

import (
	"strings"
	"testing"
)

// The exported checkers give the same verdict, and the same words, as the
// nether.conf keys they stand for.
func TestExportedIdentityCheckers(t *testing.T) {
	tests := []struct {
		name   string
		check  func(string) error
		key, v string
		wantOK bool
	}{
		{"id", CheckSandboxID, "sandbox_id", "pool-7:claim~1", true},
		{"id with a non-ASCII letter", CheckSandboxID, "sandbox_id", "caf\u00e9", false},
		{"id too long", CheckSandboxID, "sandbox_id", strings.Repeat("x", MaxSandboxID+1), false},
		{"hostname", CheckHostname, "hostname", "user-42", true},
		{"hostname with a dot", CheckHostname, "hostname", "a.b", false},
		{"hostname with a trailing dash", CheckHostname, "hostname", "a-", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.check(tt.v)
			if (err == nil) != tt.wantOK {
				t.Fatalf("check(%q) = %v, want ok=%v", tt.v, err, tt.wantOK)
			}
			_, confErr := Parse(strings.NewReader(tt.key+" = "+tt.v+"\n"), FileName, t.TempDir())
			if (confErr == nil) != tt.wantOK {
				t.Fatalf("nether.conf %s = %q: %v, but the checker says ok=%v", tt.key, tt.v, confErr, tt.wantOK)
			}
			if err != nil && !strings.Contains(confErr.Error(), err.Error()) {
				t.Errorf("the checker says %q, nether.conf %q", err, confErr)
			}
		})
	}
}
