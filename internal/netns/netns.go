// Package netns gives a sandbox in proxy mode its network: a network
// namespace created and owned by the host (no capability inside can
// reconfigure it), one veth to the host with a small subnet leased from a
// pool, IPv6 off, and nftables rules in the namespace itself (one table,
// added in one atomic batch, gone with the namespace) that let the sandbox
// reach its egress proxy and DNS forwarder on the host end of its veth and
// nothing else. A wall whose sandbox puts its own frames on the veth
// (gVisor's netstack) gets the same rules on the veth's host end too, in a
// table of the host's named after it (firewall.go). Links, addresses and
// routes go through netlink, the firewall through nftables; nothing shells
// out. It imports netlink,
// netns, nftables, x/sys and internal/linux/lockfile.
package netns

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/linux/lockfile"
)

// vethMTU is the MTU of both ends of a sandbox's veth (loopback's).
const vethMTU = 65535

// DefaultPool is the subnet pool: one /30 per sandbox.
var DefaultPool = netip.MustParsePrefix("10.234.0.0/16")

// Net is one sandbox's network.
type Net struct {
	ID        string
	NS        netns.NsHandle // hold it: the namespace lives while it is open
	HostIP    netip.Addr     // the host end of the veth: proxy and DNS listen here
	SandboxIP netip.Addr
	HostIf    string
	lease     *lockfile.Lock
	fw        *firewall
}

// Ports the sandbox may reach on HostIP (TCP), besides DNS (UDP and TCP 53).
type Ports struct {
	Explicit, TransparentHTTP, TransparentTLS, DNS int
}

// Create makes the namespace, the veth and the rules; hostSide adds the
// rules on the veth's host end too, for a sandbox whose packets do not go
// through the namespace's own IP stack. On error, whatever was made is
// removed.
func Create(id string, pool netip.Prefix, leaseDir string, ports Ports, hostSide bool) (_ *Net, err error) {
	if !pool.Addr().Is4() || pool.Bits() > 28 {
		return nil, fmt.Errorf("subnet pool %s: need an IPv4 prefix of /28 or larger", pool)
	}
	n := &Net{ID: id, HostIf: hostIfName(id), NS: -1}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	if err := os.MkdirAll(leaseDir, 0o700); err != nil {
		return nil, err
	}
	if err := n.leaseSubnet(pool, leaseDir); err != nil {
		return nil, err
	}
	if n.NS, err = newNamespace(); err != nil {
		return nil, err
	}
	peer := "alk" + id[:min(len(id), 10)] + "s"
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: n.HostIf}, PeerName: peer, PeerNamespace: netlink.NsFd(n.NS)}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("add veth %s: %w", n.HostIf, err)
	}
	host, err := netlink.LinkByName(n.HostIf)
	if err != nil {
		return nil, err
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: prefixNet(n.HostIP, 30)}); err != nil {
		return nil, fmt.Errorf("address %s: %w", n.HostIP, err)
	}
	// The veth carries only sandbox <-> proxy traffic on this machine: a
	// loopback-sized MTU cuts the per-packet cost of every proxied byte.
	if err := netlink.LinkSetMTU(host, vethMTU); err != nil {
		return nil, fmt.Errorf("veth mtu: %w", err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return nil, err
	}
	in, err := netlink.NewHandleAt(n.NS)
	if err != nil {
		return nil, fmt.Errorf("netlink in the sandbox namespace: %w", err)
	}
	defer in.Close()
	lo, err := in.LinkByName("lo")
	if err != nil {
		return nil, err
	}
	if err := in.LinkSetUp(lo); err != nil {
		return nil, fmt.Errorf("lo up: %w", err)
	}
	eth, err := in.LinkByName(peer)
	if err != nil {
		return nil, err
	}
	if err := in.LinkSetName(eth, "eth0"); err != nil {
		return nil, err
	}
	if err := in.LinkSetMTU(eth, vethMTU); err != nil {
		return nil, fmt.Errorf("eth0 mtu: %w", err)
	}
	if err := in.AddrAdd(eth, &netlink.Addr{IPNet: prefixNet(n.SandboxIP, 30)}); err != nil {
		return nil, err
	}
	if err := in.LinkSetUp(eth); err != nil {
		return nil, err
	}
	if err := in.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: n.HostIP.AsSlice(), Dst: nil}); err != nil {
		return nil, fmt.Errorf("default route: %w", err)
	}
	if n.fw, err = addRules(int(n.NS), n.HostIP, ports); err != nil {
		return nil, err
	}
	if hostSide {
		if err := addHostRules(n.HostIf, n.HostIP, pool, ports); err != nil {
			return nil, err
		}
		n.fw.hostIf = n.HostIf
	}
	return n, nil
}

// hostIfName is the name of the host end of sandbox id's veth.
func hostIfName(id string) string { return "alk" + id[:min(len(id), 10)] + "h" }

// isHostIf reports whether name is one hostIfName makes.
func isHostIf(name string) bool {
	return len(name) > 4 && len(name) <= 14 && strings.HasPrefix(name, "alk") && strings.HasSuffix(name, "h")
}

// newNamespace creates a network namespace with IPv6 disabled, on a locked
// thread that returns to the original namespace afterwards.
func newNamespace() (netns.NsHandle, error) {
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return -1, err
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		return -1, fmt.Errorf("new network namespace: %w", err)
	}
	// /proc/sys/net is the namespace of the thread that opens it.
	var werr error
	for _, f := range []string{"/proc/sys/net/ipv6/conf/all/disable_ipv6", "/proc/sys/net/ipv6/conf/default/disable_ipv6"} {
		if err := os.WriteFile(f, []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			werr = fmt.Errorf("disable IPv6: %w", err)
		}
	}
	if err := netns.Set(orig); err != nil {
		// This thread must not go back to the pool in the wrong namespace.
		panic(fmt.Sprintf("netns: cannot return to the host network namespace: %v", err))
	}
	if werr != nil {
		ns.Close()
		return -1, werr
	}
	return ns, nil
}

func (n *Net) leaseSubnet(pool netip.Prefix, dir string) error {
	slots := 1 << (30 - pool.Bits())
	base := binary.BigEndian.Uint32(pool.Masked().Addr().AsSlice())
	h := 0
	for _, c := range n.ID {
		h = h*31 + int(c)
	}
	for i := 0; i < slots; i++ {
		slot := (h + i) % slots
		if slot < 0 {
			slot += slots
		}
		l, err := lockfile.TryLock(filepath.Join(dir, strconv.Itoa(slot)+".lock"))
		if err != nil {
			return err
		}
		if l != nil {
			host := addr4(base + uint32(slot)*4 + 1)
			// The veth of the slot's last holder dies with its namespace,
			// asynchronously: while its address is still on a link, the
			// slot is not free.
			if addressInUse(host) {
				l.Release()
				continue
			}
			n.lease = l
			n.HostIP = host
			n.SandboxIP = addr4(base + uint32(slot)*4 + 2)
			return nil
		}
	}
	return fmt.Errorf("all %d subnets of %s are leased", slots, pool)
}

// Close drops the namespace and the lease. The veth and the rules are not
// deleted one by one: they go with the namespace, which the kernel tears
// down once its last process and descriptor are gone (deleting them
// synchronously costs RCU grace periods, tens of milliseconds); the slot is
// not leased again while its address is still on a link. The host side's
// table, if any, is deleted. Safe on a half-made Net.
func (n *Net) Close() error {
	var errs []error
	if n.fw != nil && n.fw.hostIf != "" {
		errs = append(errs, delHostRules(n.fw.hostIf))
	}
	n.fw = nil // its table goes with the namespace
	if n.NS >= 0 {
		n.NS.Close()
		n.NS = -1
	}
	if n.lease != nil {
		n.lease.Release()
		n.lease = nil
	}
	return errors.Join(errs...)
}

// DeniedPackets is what the sandbox's drop rules counted so far.
func (n *Net) DeniedPackets() uint64 {
	if n.fw == nil {
		return 0
	}
	return n.fw.denied()
}

// File returns a descriptor of the namespace of the caller's own (to close),
// for the runtime to clone into.
func (n *Net) File() (*os.File, error) {
	fd, err := unix.FcntlInt(uintptr(n.NS), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup network namespace: %w", err)
	}
	return os.NewFile(uintptr(fd), "netns-"+n.ID), nil
}

func addressInUse(a netip.Addr) bool {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return true
	}
	for _, x := range addrs {
		if x.IP.Equal(a.AsSlice()) {
			return true
		}
	}
	return false
}

func addr4(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

func prefixNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}
}

// Reap removes subnet lease files nobody holds (their veths and rules
// vanished with their namespaces), and the host side's tables whose veth
// is gone (their sandbox's owner died before closing its network).
func Reap(leaseDir string) error {
	lockfile.Reap(leaseDir)
	hostIfs, err := hostTables()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	var errs []error
	for _, hostIf := range hostIfs {
		if _, err := netlink.LinkByName(hostIf); errors.As(err, new(netlink.LinkNotFoundError)) {
			errs = append(errs, delHostRules(hostIf))
		}
	}
	return errors.Join(errs...)
}

// Adopt takes over the network of sandbox id made by an earlier process:
// ns is the namespace (from the sandbox's init), the veth's host end still
// carries the leased address, and the lease is taken again (and the host
// side's table, when the sandbox has one).
func Adopt(id string, ns *os.File, pool netip.Prefix, leaseDir string) (_ *Net, err error) {
	n := &Net{ID: id, HostIf: hostIfName(id), NS: -1}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	link, err := netlink.LinkByName(n.HostIf)
	if err != nil {
		return nil, fmt.Errorf("veth %s: %w", n.HostIf, err)
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 {
		return nil, fmt.Errorf("veth %s: want one IPv4 address, got %v (%v)", n.HostIf, addrs, err)
	}
	host, ok := netip.AddrFromSlice(addrs[0].IP.To4())
	if !ok || !pool.Contains(host) {
		return nil, fmt.Errorf("veth %s: address %v is not in the pool %s", n.HostIf, addrs[0].IP, pool)
	}
	off := binary.BigEndian.Uint32(host.AsSlice()) - binary.BigEndian.Uint32(pool.Masked().Addr().AsSlice())
	if off%4 != 1 {
		return nil, fmt.Errorf("veth %s: %v is not a leased host address", n.HostIf, host)
	}
	if err := os.MkdirAll(leaseDir, 0o700); err != nil {
		return nil, err
	}
	l, err := lockfile.TryLock(filepath.Join(leaseDir, strconv.Itoa(int(off/4))+".lock"))
	if err != nil {
		return nil, err
	}
	if l == nil {
		return nil, fmt.Errorf("subnet of %v is leased by another sandbox", host)
	}
	n.lease, n.HostIP, n.SandboxIP = l, host, host.Next()
	fd, err := unix.FcntlInt(ns.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	n.NS = netns.NsHandle(fd)
	n.fw = &firewall{nsfd: fd}
	if left, err := hostTables(); err == nil && slices.Contains(left, n.HostIf) {
		n.fw.hostIf = n.HostIf
	}
	return n, nil
}
