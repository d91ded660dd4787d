package engine

import (
	"bytes"
	"fmt"
	"os"
)

// Accel is how the guest CPU runs. It is both the accel key of
// nether.conf (internal/conf stores this type, so the configured and the
// resolved value cannot drift apart) and the resolved choice in a Spec.
type Accel string

const (
	AccelAuto Accel = "auto" // configuration only: kvm when usable, else tcg
	AccelKVM  Accel = "kvm"
	AccelTCG  Accel = "tcg"
)

// Valid reports whether a is one of the accelerators a configuration may
// name. The empty string is not: ResolveAccel treats it as auto for
// callers that build a Spec by hand, but a settings file must say which.
func (a Accel) Valid() bool {
	switch a {
	case AccelAuto, AccelKVM, AccelTCG:
		return true
	}
	return false
}

// HostFacts is what accel resolution looks at; tests inject their own.
type HostFacts struct {
	CPUInfo  []byte // contents of /proc/cpuinfo
	KVMError error  // result of opening /dev/kvm read-write
}

// ReadHostFacts reads the real host.
func ReadHostFacts() HostFacts {
	info, _ := os.ReadFile("/proc/cpuinfo")
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err == nil {
		f.Close()
	}
	return HostFacts{CPUInfo: info, KVMError: err}
}

// HasHardwareVirt reports whether the CPU advertises VT-x or AMD-V. Some
// hosts expose a /dev/kvm that cannot run a stock kernel (a paravirtual
// KVM without vmx/svm), so /dev/kvm alone proves nothing.
func (h HostFacts) HasHardwareVirt() bool {
	for _, line := range bytes.Split(h.CPUInfo, []byte("\n")) {
		if !bytes.HasPrefix(line, []byte("flags")) {
			continue
		}
		for _, f := range bytes.Fields(line) {
			if bytes.Equal(f, []byte("vmx")) || bytes.Equal(f, []byte("svm")) {
				return true
			}
		}
	}
	return false
}

// ResolveAccel turns the configured accel into the one to use and a reason
// for the log. auto picks KVM only on a CPU with vmx/svm and a usable
// /dev/kvm; an explicit kvm on a host without them is an error, not a
// silent fallback.
func ResolveAccel(want Accel, h HostFacts) (Accel, string, error) {
	switch want {
	case AccelTCG:
		return AccelTCG, "accel=tcg configured", nil
	case AccelKVM:
		if !h.HasHardwareVirt() {
			return "", "", fmt.Errorf("accel=kvm: this CPU shows neither vmx nor svm, so KVM cannot run a stock guest kernel; use accel=tcg or auto")
		}
		if h.KVMError != nil {
			return "", "", fmt.Errorf("accel=kvm: opening /dev/kvm: %w", h.KVMError)
		}
		return AccelKVM, "accel=kvm configured", nil
	case AccelAuto, "":
		if !h.HasHardwareVirt() {
			return AccelTCG, "auto: CPU shows no vmx/svm, using TCG", nil
		}
		if h.KVMError != nil {
			return AccelTCG, fmt.Sprintf("auto: /dev/kvm unusable (%v), using TCG", h.KVMError), nil
		}
		return AccelKVM, "auto: CPU has hardware virtualization and /dev/kvm works", nil
	}
	return "", "", fmt.Errorf("accel=%q: want auto, kvm or tcg", want)
}
