package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The guest's side of the network (net = 1). The host stack plays the
// router at 10.0.2.2 and the resolver at 10.0.2.3 on the NIC's link and
// answers ARP for both, so the guest needs no DHCP and waits for nothing:
// its addresses are fixed here, and the first packet a command sends finds
// the link ready.
const (
	netIface = "eth0"
	// netModuleList is what guestimage.NetModuleListPath names: the
	// modules a guest with a network loads after the base list.
	netModuleList = "/etc/nether/modules.net"
	// netIfaceWait bounds the wait for the NIC's interface. virtio_net
	// registers it while its module loads, so it is there at once; the
	// bound only turns a guest without the device into an error.
	netIfaceWait = 2 * time.Second
)

var (
	guestAddr  = netip.MustParsePrefix("10.0.2.15/24")
	gateway    = netip.MustParseAddr("10.0.2.2")
	nameserver = netip.MustParseAddr("10.0.2.3")
)

// setupNetwork configures the guest's network: eth0 up at 10.0.2.15/24, a
// default route via 10.0.2.2, /etc/resolv.conf naming 10.0.2.3. IPv6 is
// off on eth0 (the host's firewall and stack are IPv4-only): no
// link-local address, so no router solicitations, duplicate address
// detection or multicast listener reports ever reach the link.
func setupNetwork(log *slog.Logger) error {
	start := time.Now()
	// Set before the NIC exists, so eth0 is born without IPv6 and never
	// sends a single IPv6 frame; lo keeps ::1.
	if err := writeSysctl("net/ipv6/conf/default/disable_ipv6", "1"); err != nil {
		return fmt.Errorf("disabling IPv6 for new interfaces: %w", err)
	}
	if err := loadModules(netModuleList, log); err != nil {
		return err
	}
	index, err := waitInterface(netIface, netIfaceWait)
	if err != nil {
		return err
	}
	if err := writeSysctl("net/ipv6/conf/"+netIface+"/disable_ipv6", "1"); err != nil {
		return fmt.Errorf("disabling IPv6 on %s: %w", netIface, err)
	}
	if err := linkUp(netIface); err != nil {
		return fmt.Errorf("bringing up %s: %w", netIface, err)
	}
	if err := netlinkDo(
		addrRequest(1, index, guestAddr),
		routeRequest(2, index, gateway),
	); err != nil {
		return fmt.Errorf("configuring %s: %w", netIface, err)
	}
	if err := os.WriteFile("/etc/resolv.conf", []byte(resolvConf(nameserver)), 0o644); err != nil {
		return fmt.Errorf("writing /etc/resolv.conf: %w", err)
	}
	log.Debug("agent: network configured", "iface", netIface, "addr", guestAddr, "gateway", gateway, "took", time.Since(start))
	return nil
}

func resolvConf(ns netip.Addr) string {
	return "nameserver " + ns.String() + "\n"
}

// hostsFile is /etc/hosts for hostname: the loopback names and the
// hostname on 127.0.1.1 (Debian's convention), so the guest resolves its
// own name with or without a network.
func hostsFile(hostname string) string {
	return "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" + hostname + "\n"
}

func writeSysctl(name, value string) error {
	return os.WriteFile(filepath.Join("/proc/sys", name), []byte(value), 0o644)
}

// waitInterface returns the interface index of name once it exists.
func waitInterface(name string, wait time.Duration) (int, error) {
	deadline := time.Now().Add(wait)
	for {
		b, err := os.ReadFile(filepath.Join("/sys/class/net", name, "ifindex"))
		if err == nil {
			index, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				return 0, fmt.Errorf("interface %s: ifindex %q: %w", name, b, err)
			}
			return index, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("interface %s did not appear within %s (is the NIC there? virtio_net loaded?): %w", name, wait, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// nlAttr is one route attribute of a netlink message.
type nlAttr struct {
	typ  uint16
	data []byte
}

// nlAlign rounds n up to netlink's 4-byte alignment.
func nlAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

// nlMessage is one netlink request: the header, the fixed body of its
// type, then the attributes, each padded to 4 bytes. Host byte order, as
// netlink speaks it; the port id is 0 and the kernel fills in ours.
func nlMessage(typ, flags uint16, seq uint32, body []byte, attrs ...nlAttr) []byte {
	n := unix.NLMSG_HDRLEN + nlAlign(len(body))
	for _, a := range attrs {
		n += nlAlign(unix.SizeofRtAttr + len(a.data))
	}
	b := make([]byte, n)
	binary.NativeEndian.PutUint32(b[0:], uint32(n))
	binary.NativeEndian.PutUint16(b[4:], typ)
	binary.NativeEndian.PutUint16(b[6:], flags)
	binary.NativeEndian.PutUint32(b[8:], seq)
	off := unix.NLMSG_HDRLEN
	copy(b[off:], body)
	off += nlAlign(len(body))
	for _, a := range attrs {
		binary.NativeEndian.PutUint16(b[off:], uint16(unix.SizeofRtAttr+len(a.data)))
		binary.NativeEndian.PutUint16(b[off+2:], a.typ)
		copy(b[off+unix.SizeofRtAttr:], a.data)
		off += nlAlign(unix.SizeofRtAttr + len(a.data))
	}
	return b
}

// newFlags: create, refuse a duplicate, and acknowledge, as `ip addr add`
// and `ip route add` ask.
const newFlags = unix.NLM_F_REQUEST | unix.NLM_F_ACK | unix.NLM_F_CREATE | unix.NLM_F_EXCL

// addrRequest is RTM_NEWADDR for an IPv4 prefix on interface index: the
// kernel adds the subnet's route with it.
func addrRequest(seq uint32, index int, p netip.Prefix) []byte {
	body := make([]byte, unix.SizeofIfAddrmsg)
	body[0] = unix.AF_INET
	body[1] = byte(p.Bits())
	body[3] = unix.RT_SCOPE_UNIVERSE
	binary.NativeEndian.PutUint32(body[4:], uint32(index))
	a := p.Addr().As4()
	return nlMessage(unix.RTM_NEWADDR, newFlags, seq, body,
		nlAttr{unix.IFA_LOCAL, a[:]}, nlAttr{unix.IFA_ADDRESS, a[:]})
}

// routeRequest is RTM_NEWROUTE for the IPv4 default route via gw out of
// interface index, in the main table.
func routeRequest(seq uint32, index int, gw netip.Addr) []byte {
	body := make([]byte, unix.SizeofRtMsg)
	body[0] = unix.AF_INET
	body[4] = unix.RT_TABLE_MAIN
	body[5] = unix.RTPROT_BOOT
	body[6] = unix.RT_SCOPE_UNIVERSE
	body[7] = unix.RTN_UNICAST
	g := gw.As4()
	oif := binary.NativeEndian.AppendUint32(nil, uint32(index))
	return nlMessage(unix.RTM_NEWROUTE, newFlags, seq, body,
		nlAttr{unix.RTA_GATEWAY, g[:]}, nlAttr{unix.RTA_OIF, oif})
}

// setMAC gives interface name the hardware address mac, while it is up
// (virtio-net changes it live, through its control queue).
func setMAC(name, mac string) error {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return fmt.Errorf("%q is not an Ethernet address", mac)
	}
	index, err := waitInterface(name, 0)
	if err != nil {
		return err
	}
	return netlinkDo(linkAddressRequest(1, index, hw))
}

// linkAddressRequest is RTM_SETLINK setting interface index's hardware
// address, as `ip link set dev eth0 address ...` asks.
func linkAddressRequest(seq uint32, index int, hw net.HardwareAddr) []byte {
	body := make([]byte, unix.SizeofIfInfomsg)
	body[0] = unix.AF_UNSPEC
	binary.NativeEndian.PutUint32(body[4:], uint32(index))
	return nlMessage(unix.RTM_SETLINK, unix.NLM_F_REQUEST|unix.NLM_F_ACK, seq, body, nlAttr{unix.IFLA_ADDRESS, hw})
}

// netlinkDo sends each request to the kernel's routing netlink in turn
// and waits for its acknowledgement.
func netlinkDo(reqs ...[]byte) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink bind: %w", err)
	}
	buf := make([]byte, 8192)
	for _, req := range reqs {
		seq := binary.NativeEndian.Uint32(req[8:])
		if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return fmt.Errorf("netlink send: %w", err)
		}
		for done := false; !done; {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				return fmt.Errorf("netlink receive: %w", err)
			}
			if done, err = parseAck(buf[:n], seq); err != nil {
				return fmt.Errorf("%s: %w", nlTypeName(binary.NativeEndian.Uint16(req[4:])), err)
			}
		}
	}
	return nil
}

func nlTypeName(t uint16) string {
	switch t {
	case unix.RTM_NEWADDR:
		return "adding the address"
	case unix.RTM_NEWROUTE:
		return "adding the route"
	}
	return fmt.Sprintf("netlink request %d", t)
}

// parseAck looks for the acknowledgement of request seq in what the
// kernel sent: done once it is there, with the request's error if it
// failed.
func parseAck(b []byte, seq uint32) (done bool, err error) {
	for len(b) >= unix.NLMSG_HDRLEN {
		n := int(binary.NativeEndian.Uint32(b[0:]))
		if n < unix.NLMSG_HDRLEN || n > len(b) {
			return false, fmt.Errorf("malformed netlink message (length %d of %d bytes)", n, len(b))
		}
		typ, mseq, data := binary.NativeEndian.Uint16(b[4:]), binary.NativeEndian.Uint32(b[8:]), b[unix.NLMSG_HDRLEN:n]
		b = b[min(nlAlign(n), len(b)):]
		if mseq != seq || typ != unix.NLMSG_ERROR {
			continue
		}
		if len(data) < 4 {
			return true, errors.New("short netlink acknowledgement")
		}
		if e := int32(binary.NativeEndian.Uint32(data)); e != 0 {
			return true, unix.Errno(-e)
		}
		return true, nil
	}
	return false, nil
}
