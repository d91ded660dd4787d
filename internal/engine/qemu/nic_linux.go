package qemu

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/nethersandbox/nether/internal/engine"
)

// nicDevice is the guest NIC: virtio-net on PCI with the fixed MAC and no
// option ROM (the iPXE ROM would only cost firmware time; the guest never
// boots from the network), announcing the link's MTU (engine.NICMTU).
var nicDevice = fmt.Sprintf("virtio-net-pci,netdev=net0,mac=%s,host_mtu=%d,romfile=", engine.NICMAC, engine.NICMTU)

// nicNetdev is the NIC's backend: QEMU 7.2's dgram netdev on a descriptor
// it inherits, which sends and receives one frame per message. Measured
// on QEMU 7.2 with a socketpair: dgram takes SOCK_SEQPACKET and
// SOCK_DGRAM; "socket,fd=" takes only SOCK_DGRAM (it refuses
// SOCK_SEQPACKET); "stream" prefixes every frame with a 4-byte length, so
// a reader would have to reassemble frames from a byte stream.
func nicNetdev(fd int) string {
	return fmt.Sprintf("dgram,id=net0,local.type=fd,local.str=%d", fd)
}

// newNICPair makes the NIC's frame channel: a SOCK_SEQPACKET socketpair
// rather than SOCK_DGRAM because it keeps message boundaries the same
// way and, unlike a datagram pair, tells the host reader when QEMU is
// gone (end-of-file), so a reader never blocks on a dead link. The host
// end is non-blocking, so its reads and writes go through Go's poller:
// they take deadlines and a Close wakes them. The guest end is for
// QEMU's ExtraFiles; QEMU makes it non-blocking itself.
func newNICPair() (host, guest *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the NIC's frame channel: %w", err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, fmt.Errorf("creating the NIC's frame channel: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "nic"), os.NewFile(uintptr(fds[1]), "nic-qemu"), nil
}

// NIC implements engine.Machine.
func (m *Machine) NIC() *os.File { return m.nic }
