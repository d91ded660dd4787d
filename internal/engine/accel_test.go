package engine

import (
	"errors"
	"testing"
)

func TestResolveAccel(t *testing.T) {
	vmx := []byte("processor\t: 0\nflags\t\t: fpu vme vmx sse\n")
	plain := []byte("processor\t: 0\nflags\t\t: fpu vme sse hypervisor\n")
	noKVM := errors.New("no such file")
	cases := []struct {
		name    string
		want    Accel
		facts   HostFacts
		got     Accel
		wantErr bool
	}{
		{"auto with vmx and kvm", AccelAuto, HostFacts{vmx, nil}, AccelKVM, false},
		{"auto without vmx", AccelAuto, HostFacts{plain, nil}, AccelTCG, false},
		{"auto with vmx, kvm broken", AccelAuto, HostFacts{vmx, noKVM}, AccelTCG, false},
		{"kvm without vmx", AccelKVM, HostFacts{plain, nil}, "", true},
		{"kvm without device", AccelKVM, HostFacts{vmx, noKVM}, "", true},
		{"kvm ok", AccelKVM, HostFacts{vmx, nil}, AccelKVM, false},
		{"tcg always", AccelTCG, HostFacts{vmx, nil}, AccelTCG, false},
		{"svm counts", AccelAuto, HostFacts{[]byte("flags : svm\n"), nil}, AccelKVM, false},
		{"vmx in model name does not count", AccelAuto, HostFacts{[]byte("model name : vmx\nflags : sse\n"), nil}, AccelTCG, false},
		{"bogus", "fast", HostFacts{vmx, nil}, "", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, reason, err := ResolveAccel(c.want, c.facts)
			if (err != nil) != c.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, c.wantErr)
			}
			if got != c.got {
				t.Fatalf("got %q, want %q", got, c.got)
			}
			if err == nil && reason == "" {
				t.Fatal("no reason given")
			}
		})
	}
}

func TestAccelValid(t *testing.T) {
	cases := []struct {
		a    Accel
		want bool
	}{
		{AccelAuto, true},
		{AccelKVM, true},
		{AccelTCG, true},
		{"", false},    // ResolveAccel's hand-built default, not a config value
		{"KVM", false}, // the key is case-sensitive
		{"hvf", false},
		{"kvm ", false},
	}
	for _, c := range cases {
		t.Run(string(c.a), func(t *testing.T) {
			if got := c.a.Valid(); got != c.want {
				t.Fatalf("Accel(%q).Valid() = %v, want %v", c.a, got, c.want)
			}
		})
	}
}
