package netstack

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// pollable duplicates link as a non-blocking file, so that its reads and
// writes go through Go's poller and Close wakes them, whatever mode the
// engine's file is in. The descriptor is read through Control rather
// than Fd, which would switch link to blocking mode.
func pollable(link *os.File) (*os.File, error) {
	rc, err := link.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("netstack: the link: %w", err)
	}
	dup := -1
	var derr error
	if err := rc.Control(func(fd uintptr) {
		dup, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return nil, fmt.Errorf("netstack: the link: %w", err)
	}
	if derr != nil {
		return nil, fmt.Errorf("netstack: duplicating the link: %w", derr)
	}
	if err := unix.SetNonblock(dup, true); err != nil {
		unix.Close(dup)
		return nil, fmt.Errorf("netstack: the link: %w", err)
	}
	return os.NewFile(uintptr(dup), "netstack-link"), nil
}

// inbound moves the guest's frames into the stack. Only frames from the
// guest's own MAC and address get in; echo requests are answered here
// (see icmp.go).
func (n *Stack) inbound() {
	defer n.wg.Done()
	buf := make([]byte, 65536)
	for {
		k, err := n.io.Read(buf)
		if err != nil {
			// End of file: the engine closed its end (QEMU is gone).
			if n.ctx.Err() == nil && !errors.Is(err, io.EOF) {
				n.log.Warn("reading the guest's link", "err", err)
			}
			return
		}
		frame := buf[:k]
		if !n.fromGuest(frame) {
			n.dropped.Add(1)
			continue
		}
		if n.ping(frame) {
			continue
		}
		n.seqs.fromGuest(frame)
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(frame)})
		n.ch.InjectInbound(0, pkt)
		pkt.DecRef()
	}
}

var guestIP = tcpip.AddrFrom4(GuestAddr.As4())

// fromGuest accepts ARP and IPv4 frames sent from the guest's MAC whose
// sender address is the guest's: anything else is spoofed or of a
// protocol the guest's network does not carry. The guest's MAC is the
// NIC's, or the one SetGuestMAC gave it.
func (n *Stack) fromGuest(f []byte) bool {
	if len(f) < header.EthernetMinimumSize {
		return false
	}
	eth := header.Ethernet(f)
	src := eth.SourceAddress()
	if !n.isGuestMAC(src) {
		return false
	}
	p := f[header.EthernetMinimumSize:]
	switch eth.Type() {
	case header.ARPProtocolNumber:
		a := header.ARP(p)
		return a.IsValid() && tcpip.AddrFromSlice(a.ProtocolAddressSender()) == guestIP &&
			tcpip.LinkAddress(a.HardwareAddressSender()) == src
	case header.IPv4ProtocolNumber:
		ip := header.IPv4(p)
		return ip.IsValid(len(p)) && ip.SourceAddress() == guestIP
	}
	return false
}

// outbound writes the stack's frames to the guest.
func (n *Stack) outbound() {
	defer n.wg.Done()
	buf := make([]byte, 0, 65536)
	for {
		pkt := n.ch.ReadContext(n.ctx)
		if pkt == nil {
			return
		}
		b := buf[:0]
		for _, s := range pkt.AsSlices() {
			b = append(b, s...)
		}
		pkt.DecRef()
		n.seqs.toGuest(b)
		if _, err := n.io.Write(b); err != nil {
			if n.ctx.Err() != nil {
				return
			}
			// A full or gone peer: the frame is lost like on a wire,
			// and TCP retransmits.
			n.log.Debug("writing a frame to the guest", "err", err)
		}
	}
}

// inject writes a frame the stack made by hand (an echo reply, a reset)
// to the guest, addressed to its current MAC.
func (n *Stack) inject(f []byte) {
	if len(f) >= header.EthernetMinimumSize {
		copy(f[:6], n.currentMAC())
	}
	n.io.Write(f)
}

func (n *Stack) currentMAC() tcpip.LinkAddress {
	if m := n.mac.Load(); m != nil {
		return *m
	}
	return guestMAC
}

// GuestMAC is the address SetGuestMAC gave the guest, or nil while it has
// the NIC's first.
func (n *Stack) GuestMAC() net.HardwareAddr {
	if m := n.mac.Load(); m != nil {
		return net.HardwareAddr(*m)
	}
	return nil
}

func (n *Stack) isGuestMAC(a tcpip.LinkAddress) bool {
	return a == guestMAC || a == n.currentMAC()
}

// SetGuestMAC is the guest's new hardware address (a fork's own, which
// its agent has just set): frames from it are the guest's, frames to the
// guest go to it. The NIC's first address is still accepted from the
// guest, for frames it sent before the change.
func (n *Stack) SetGuestMAC(mac net.HardwareAddr) error {
	if len(mac) != 6 || mac[0]&1 != 0 {
		return fmt.Errorf("netstack: %s is not a unicast Ethernet address", mac)
	}
	la := tcpip.LinkAddress(mac)
	n.mac.Store(&la)
	// The stack may have learned the old address from the guest's ARP;
	// it must send to the new one at once, without a round of ARP the
	// guest has no reason to start.
	if err := n.s.AddStaticNeighbor(nicID, ipv4.ProtocolNumber, guestIP, la); err != nil {
		return fmt.Errorf("netstack: the guest's new MAC: %v", err)
	}
	return nil
}
