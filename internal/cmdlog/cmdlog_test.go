package cmdlog

import (
	"fmt"
	"strings"
	"testing"
)

func TestReply(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []Entry
		want    string
	}{
		{"empty", nil, "CMDLOG 0\n"},
		{"one", []Entry{{MS: 12, Exit: 0, CPUMS: 3, Command: "echo hi"}}, "CMDLOG 1\n12 exit=0 cpu_ms=3 echo hi\n"},
		{"negative exit is 255", []Entry{{MS: 1, Exit: -1, Command: "x"}}, "CMDLOG 1\n1 exit=255 cpu_ms=0 x\n"},
		{"exit over 255 is 255", []Entry{{MS: 1, Exit: 256, Command: "x"}}, "CMDLOG 1\n1 exit=255 cpu_ms=0 x\n"},
		{"control bytes escaped", []Entry{{MS: 5, Exit: 1, CPUMS: 2, Command: "printf 'a\tb'\r"}}, "CMDLOG 1\n5 exit=1 cpu_ms=2 printf 'a\\x09b'\\x0d\n"},
		{"negative cpu is 0", []Entry{{MS: 1, Exit: 0, CPUMS: -4, Command: "x"}}, "CMDLOG 1\n1 exit=0 cpu_ms=0 x\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := New(4)
			for _, e := range tc.entries {
				l.Add(e)
			}
			if got := string(l.Reply()); got != tc.want {
				t.Fatalf("Reply() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestDropsOldest(t *testing.T) {
	l := New(3)
	for i := range 5 {
		l.Add(Entry{MS: int64(i), Command: fmt.Sprint("c", i)})
	}
	want := "CMDLOG 3 dropped=2\n2 exit=0 cpu_ms=0 c2\n3 exit=0 cpu_ms=0 c3\n4 exit=0 cpu_ms=0 c4\n"
	if got := string(l.Reply()); got != want {
		t.Fatalf("Reply() = %q, want %q", got, want)
	}
}

func TestCommandBounded(t *testing.T) {
	l := New(1)
	l.Add(Entry{Command: strings.Repeat("x", 100*MaxCommand)})
	entries, _ := l.Entries()
	if n := len(entries[0].Command); n > MaxCommand+32 {
		t.Fatalf("logged command is %d bytes, want it bounded near %d", n, MaxCommand)
	}
}
