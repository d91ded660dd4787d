package qemu

import (
	"context"
	"errors"
	"os"
	"testing"
)

// testSink is a sink whose identity is all that matters here.
type testSink struct{ _ byte } // not zero-size: two of them never share an address

func (*testSink) CreateFile(string) (*os.File, error) { return nil, errors.New("not here") }

// Capture finishes a Precopy into the same sink; called without one, or
// into another sink, it fails before it touches anything (the zero
// Machine has no QMP connection: any command would panic).
func TestCaptureWithoutPrecopy(t *testing.T) {
	for _, tc := range []struct {
		name string
		live *liveCapture
	}{
		{"no precopy", nil},
		{"a precopy into another sink", &liveCapture{sink: &testSink{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &Machine{live: tc.live}
			if _, err := m.Capture(context.Background(), &testSink{}); !errors.Is(err, errNoPrecopy) {
				t.Fatalf("Capture = %v, want errNoPrecopy", err)
			}
		})
	}
}
