package netstack

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
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
		if !fromGuest(frame) {
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
// protocol the guest's network does not carry.
func fromGuest(f []byte) bool {
	if len(f) < header.EthernetMinimumSize {
		return false
	}
	eth := header.Ethernet(f)
	if eth.SourceAddress() != guestMAC {
		return false
	}
	p := f[header.EthernetMinimumSize:]
	switch eth.Type() {
	case header.ARPProtocolNumber:
		a := header.ARP(p)
		return a.IsValid() && tcpip.AddrFromSlice(a.ProtocolAddressSender()) == guestIP &&
			tcpip.LinkAddress(a.HardwareAddressSender()) == guestMAC
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
