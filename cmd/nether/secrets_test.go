package main

import (
	"os"
	"strings"
	"testing"
)

// secrets_fd: a descriptor that is not open is refused by name, and a
// good one is read and closed.
func TestReadSecrets(t *testing.T) {
	if s, err := readSecrets(0); s != nil || err != nil {
		t.Fatalf("no secrets_fd: %q, %v", s, err)
	}
	if _, err := readSecrets(987); err == nil || !strings.Contains(err.Error(), "not an open descriptor") {
		t.Fatalf("a closed descriptor: %v", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	w.WriteString(`{"API_KEY":"dmFsdWU="}`)
	w.Close()
	fd := int(r.Fd())
	got, err := readSecrets(fd)
	if err != nil || string(got["API_KEY"]) != "value" {
		t.Fatalf("readSecrets = %q, %v", got, err)
	}
	r2, w2, _ := os.Pipe()
	defer r2.Close()
	w2.WriteString("API_KEY=value")
	w2.Close()
	if _, err := readSecrets(int(r2.Fd())); err == nil || !strings.Contains(err.Error(), "not a JSON object") {
		t.Fatalf("a malformed encoding: %v", err)
	}
}
