package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --secret takes NAME=value and NAME=@file; anything else is refused
// naming the flag, and nothing of a value is in the message.
func TestParseSecrets(t *testing.T) {
	file := filepath.Join(t.TempDir(), "key")
	os.WriteFile(file, []byte("from-a-file\n"), 0o600)
	got, err := parseSecrets([]string{"API_KEY=inline-value", "DB=@" + file})
	if err != nil || string(got["API_KEY"]) != "inline-value" || string(got["DB"]) != "from-a-file\n" {
		t.Fatalf("parseSecrets = %q, %v", got, err)
	}
	for _, tt := range []struct {
		name  string
		flags []string
		want  string
	}{
		{"no value", []string{"API_KEY"}, "want NAME=value or NAME=@file"},
		{"twice", []string{"K=a", "K=b"}, "--secret K given twice"},
		{"a missing file", []string{"K=@" + filepath.Join(t.TempDir(), "none")}, "--secret K:"},
		{"a bad name", []string{"a/x=hush-value"}, "holds '/'"},
		{"too large", []string{"K=" + strings.Repeat("v", 16<<10+1)}, "at most 16384 together"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseSecrets(tt.flags)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("parseSecrets = %v, want %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "hush-value") {
				t.Errorf("a value reached the message: %v", err)
			}
		})
	}
}
