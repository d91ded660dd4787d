package qemu

import (
	"slices"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/internal/engine"
)

// A boot runs on this nether's model; a restore on the model its machine
// was captured on (older artifacts: "max"); a model this nether does not
// know is never handed to QEMU.
func TestCPUModel(t *testing.T) {
	for _, c := range []struct {
		name     string
		accel    engine.Accel
		captured *section
		want     string
		err      string
	}{
		{"a TCG boot", engine.AccelTCG, nil, "max,-erms", ""},
		{"a KVM boot", engine.AccelKVM, nil, "host", ""},
		{"a restore of a machine captured on this model", engine.AccelTCG, &section{CPU: "max,-erms"}, "max,-erms", ""},
		{"a restore of an artifact from before the model was recorded", engine.AccelTCG, &section{}, "max", ""},
		{"a restore of a machine captured on max", engine.AccelTCG, &section{CPU: "max"}, "max", ""},
		{"a KVM restore", engine.AccelKVM, &section{CPU: "host"}, "host", ""},
		{"a model this nether does not run", engine.AccelTCG, &section{CPU: "max,+evil -device x"}, "", "does not run"},
		{"a TCG model under KVM", engine.AccelKVM, &section{CPU: "max,-erms"}, "", "not under KVM"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := cpuModel(c.accel, c.captured)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("cpuModel = %q, %v; want an error saying %q", got, err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("cpuModel = %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

func TestCommandLineCPU(t *testing.T) {
	socks := map[string]string{"qmp": "q", "console": "c", "channel": "ch"}
	args := commandLine(engine.Spec{RAMMB: 64, CPUs: 1, Accel: engine.AccelTCG}, "console=ttyS0", tcgCPU, socks, "/proc/self/fd/3", true, "g", -1, "")
	i := slices.Index(args, "-cpu")
	if i < 0 || i+1 >= len(args) || args[i+1] != "max,-erms" {
		t.Fatalf("-cpu in %v", args)
	}
}

func TestCommandLineLane(t *testing.T) {
	socks := map[string]string{"qmp": "q", "console": "c", "channel": "ch"}
	spec := engine.Spec{RAMMB: 64, CPUs: 1, Accel: engine.AccelTCG}
	for _, c := range []struct {
		name, file string
		want       bool
	}{{"with a lane", "/proc/self/fd/4", true}, {"without (an older artifact)", "", false}} {
		t.Run(c.name, func(t *testing.T) {
			args := strings.Join(commandLine(spec, "console=ttyS0", tcgCPU, socks, "/proc/self/fd/3", true, "g", -1, c.file), " ")
			has := strings.Contains(args, "-device "+laneDevice) && strings.Contains(args, "mem-path="+c.file+",share=off")
			if has != c.want || strings.Contains(args, "ivshmem") != c.want {
				t.Fatalf("lane device %v, want %v: %s", has, c.want, args)
			}
		})
	}
}
