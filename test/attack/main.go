// Command attack runs one attack from inside a sandbox and reports whether
// it was stopped. It exits 0 and prints "blocked: ..." when the sandbox held,
// and exits 1 printing "VULNERABLE: ..." when the attack worked. The e2e
// tests copy it (built static) into a sandbox's workspace.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

var failed bool

func blocked(format string, a ...any) { fmt.Printf("blocked: "+format+"\n", a...) }
func vulnerable(format string, a ...any) {
	failed = true
	fmt.Printf("VULNERABLE: "+format+"\n", a...)
}

// expectErr reports err == nil as a vulnerability.
func expectErr(what string, err error) {
	if err == nil {
		vulnerable("%s succeeded", what)
		return
	}
	blocked("%s: %v", what, err)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: attack CASE [ARGS]")
		os.Exit(2)
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "read-host":
		// args: host paths that must not be visible
		for _, p := range args {
			_, err := os.ReadFile(p)
			expectErr("read "+p, err)
		}
	case "write-outside":
		for _, p := range []string{"/usr/airlock-pwned", "/etc/airlock-pwned", "/airlock-pwned", "/bin/sh", "/usr/local/bin/airlock", "/usr/bin/env", "/proc/sys/kernel/hostname", "/sys/kernel/airlock", "/dev/airlock-pwned", "/var/lib/dpkg/status"} {
			err := os.WriteFile(p, []byte("x"), 0o644)
			expectErr("write "+p, err)
		}
	case "landlock":
		// Writable by the mounts, refused by Landlock alone.
		err := os.WriteFile("/proc/self/comm", []byte("pwned"), 0)
		expectErr("write /proc/self/comm", err)
	case "host-procs":
		ents, _ := os.ReadDir("/proc")
		var pids []string
		for _, e := range ents {
			if _, err := strconv.Atoi(e.Name()); err == nil {
				pids = append(pids, e.Name())
			}
		}
		if len(pids) > 6 {
			vulnerable("sees %d processes: %v", len(pids), pids)
		} else {
			blocked("sees only %v", pids)
		}
		for _, a := range args { // host pids
			pid, _ := strconv.Atoi(a)
			expectErr("kill host pid "+a, unix.Kill(pid, 0))
		}
	case "ptrace":
		_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_ATTACH, 1, 0, 0, 0, 0)
		expectErr("ptrace attach pid 1", errnoErr(e))
		_, _, e = unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_TRACEME, 0, 0, 0, 0, 0)
		expectErr("ptrace traceme", errnoErr(e))
		_, err := os.ReadFile("/proc/1/environ")
		expectErr("read /proc/1/environ", err)
		_, err = os.Readlink("/proc/1/exe")
		expectErr("readlink /proc/1/exe", err)
		// Even where the fd numbers can be listed (root inside), none of
		// init's descriptors (its sync socket, its leases) may be opened.
		for fd := 0; fd < 16; fd++ {
			p := "/proc/1/fd/" + strconv.Itoa(fd)
			f, err := os.Open(p)
			if f != nil {
				f.Close()
			}
			if err == nil {
				vulnerable("opened %s", p)
			}
		}
		blocked("init's descriptors cannot be opened")
	case "agent":
		// The agent's socket lives in a host directory (os.Args[2]): it must
		// be unreachable by path, and no other unix socket may lead to it.
		for _, p := range os.Args[2:] {
			c, err := net.Dial("unix", p)
			if c != nil {
				c.Close()
			}
			expectErr("connect to "+p, err)
		}
		b, _ := os.ReadFile("/proc/net/unix")
		for _, l := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(l)
			if len(f) < 8 {
				continue
			}
			name := f[7]
			if strings.HasPrefix(name, "@") {
				name = "\x00" + name[1:]
			}
			c, err := net.Dial("unix", name)
			if err == nil {
				c.Close()
				vulnerable("connected to unix socket %q", f[7])
			}
		}
		blocked("no unix socket reaches the agent")
	case "exe":
		for _, p := range []string{"/proc/1/exe", "/proc/self/exe"} {
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if f != nil {
				f.Close()
			}
			expectErr("open "+p+" for writing", err)
		}
	case "fds":
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			vulnerable("cannot list fds: %v", err)
			break
		}
		var extra []string
		for _, e := range ents {
			n, _ := strconv.Atoi(e.Name())
			if n > 2 {
				// os.ReadDir's own descriptor is closed by now: a
				// descriptor that still resolves was inherited.
				if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil {
					extra = append(extra, e.Name()+"->"+target)
				}
			}
		}
		if len(extra) > 0 {
			vulnerable("inherited descriptors %v", extra)
		} else {
			blocked("only stdin, stdout, stderr are open")
		}
		wd, _ := os.Getwd()
		if wd != "/workspace" {
			vulnerable("cwd is %q", wd)
		}
	case "mount":
		expectErr("mount tmpfs", unix.Mount("tmpfs", "/tmp", "tmpfs", 0, ""))
		expectErr("mount proc", unix.Mount("proc", "/tmp", "proc", 0, ""))
		expectErr("umount /proc", unix.Unmount("/proc", unix.MNT_DETACH))
		expectErr("bind mount /", unix.Mount("/", "/tmp", "", unix.MS_BIND, ""))
	case "mknod":
		expectErr("mknod char 1:1 (/dev/mem)", unix.Mknod("/tmp/mem", unix.S_IFCHR|0o600, int(unix.Mkdev(1, 1))))
		expectErr("mknod block 8:0", unix.Mknod("/tmp/sda", unix.S_IFBLK|0o600, int(unix.Mkdev(8, 0))))
	case "setuid":
		// A setuid-root copy of this program must not raise privileges.
		self, _ := os.ReadFile("/proc/self/exe")
		if err := os.WriteFile("/tmp/suid", self, 0o755); err != nil {
			vulnerable("setup: %v", err)
			break
		}
		_ = os.Chown("/tmp/suid", 0, 0)
		_ = os.Chmod("/tmp/suid", 0o4755|os.ModeSetuid)
		out, err := exec.Command("/tmp/suid", "whoami").CombinedOutput()
		got := strings.TrimSpace(string(out))
		if err == nil && got == "0" {
			vulnerable("setuid binary ran with euid 0")
		} else {
			blocked("setuid binary ran with euid %s (%v)", got, err)
		}
		for _, p := range []string{"/usr/bin/su", "/usr/bin/passwd", "/usr/bin/newgrp"} {
			if _, err := os.Stat(p); err == nil {
				out, _ := exec.Command(p, "--help").CombinedOutput()
				_ = out
			}
		}
	case "fetch":
		// fetch URL CAFILE proxy|direct: prints "STATUS n body" or "ERROR e".
		fetch(args[0], args[1], args[2] == "direct")
		return
	case "post":
		// post URL SIZE: an upload through the proxy.
		n, _ := strconv.Atoi(args[1])
		resp, err := http.Post(args[0], "application/octet-stream", strings.NewReader(strings.Repeat("x", n)))
		if err != nil {
			fmt.Println("ERROR", err)
			return
		}
		b, _ := io.ReadAll(resp.Body)
		fmt.Println("STATUS", resp.StatusCode, strings.TrimSpace(string(b)))
		return
	case "front":
		// front HOST SNI: a CONNECT tunnel to HOST through the explicit
		// proxy, then a TLS handshake naming SNI (domain fronting).
		pu, _ := url.Parse(os.Getenv("HTTPS_PROXY"))
		c, err := net.DialTimeout("tcp", pu.Host, 3*time.Second)
		if err != nil {
			vulnerable("no proxy: %v", err)
			break
		}
		fmt.Fprintf(c, "CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n", args[0], args[0])
		br := bufio.NewReader(c)
		line, _ := br.ReadString('\n')
		for l := line; l != "\r\n" && l != ""; l, _ = br.ReadString('\n') {
		}
		tc := tls.Client(&bufConn{c, br}, &tls.Config{ServerName: args[1], InsecureSkipVerify: true})
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		err = tc.Handshake()
		c.Close()
		expectErr(fmt.Sprintf("TLS for %s through a tunnel to %s", args[1], args[0]), err)
	case "download":
		// download URL: through the proxy; prints "BYTES n SECONDS s".
		start := time.Now()
		resp, err := http.Get(args[0])
		if err != nil {
			fmt.Println("ERROR", err)
			return
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fmt.Printf("BYTES %d SECONDS %.6f\n", n, time.Since(start).Seconds())
		return
	case "getloop":
		// getloop URL N: N small GETs on one kept-alive connection through
		// the proxy; prints "MEDIAN_US m RPS r".
		n, _ := strconv.Atoi(args[1])
		lat := make([]time.Duration, 0, n)
		start := time.Now()
		for i := 0; i < n; i++ {
			t0 := time.Now()
			resp, err := http.Get(args[0])
			if err != nil {
				fmt.Println("ERROR", err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			lat = append(lat, time.Since(t0))
		}
		total := time.Since(start)
		slices.Sort(lat)
		fmt.Printf("MEDIAN_US %d RPS %.0f\n", lat[len(lat)/2].Microseconds(), float64(n)/total.Seconds())
		return
	case "tlsloop":
		// tlsloop URL N CAFILE keepalive|fresh [ENVVAR]: N HTTPS GETs
		// through the proxy, trusting CAFILE, on one kept-alive connection
		// or a new one each, with "Authorization: Bearer $ENVVAR" when
		// named; prints "MEDIAN_US m P99_US p RPS r".
		n, _ := strconv.Atoi(args[1])
		pem, err := os.ReadFile(args[2])
		if err != nil {
			fmt.Println("ERROR", err)
			return
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		tr := &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: args[3] == "fresh"}
		c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
		lat := make([]time.Duration, 0, n)
		start := time.Now()
		for i := 0; i < n; i++ {
			req, _ := http.NewRequest("GET", args[0], nil)
			if len(args) > 4 {
				req.Header.Set("Authorization", "Bearer "+os.Getenv(args[4]))
			}
			t0 := time.Now()
			resp, err := c.Do(req)
			if err != nil {
				fmt.Println("ERROR", err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				fmt.Println("ERROR status", resp.StatusCode)
				return
			}
			lat = append(lat, time.Since(t0))
		}
		total := time.Since(start)
		slices.Sort(lat)
		fmt.Printf("MEDIAN_US %d P99_US %d RPS %.0f\n", lat[len(lat)/2].Microseconds(), lat[len(lat)*99/100].Microseconds(), float64(n)/total.Seconds())
		return
	case "dial":
		// dial NETWORK ADDR: a direct connection, which must not succeed.
		// GATEWAY in ADDR stands for the sandbox's resolver (the host end
		// of its veth).
		addr := args[1]
		if strings.Contains(addr, "GATEWAY") {
			b, _ := os.ReadFile("/etc/resolv.conf")
			for _, l := range strings.Split(string(b), "\n") {
				if f := strings.Fields(l); len(f) == 2 && f[0] == "nameserver" {
					addr = strings.Replace(addr, "GATEWAY", f[1], 1)
				}
			}
		}
		c, err := net.DialTimeout(args[0], addr, 2*time.Second)
		if err == nil && args[0] == "udp" {
			_, _ = c.Write([]byte("x"))
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err = c.Read(make([]byte, 16))
		}
		if c != nil {
			c.Close()
		}
		expectErr("direct "+args[0]+" to "+args[1], err)
	case "resolve":
		// resolve NAME [SERVER]: prints the addresses or "ERROR".
		r := net.DefaultResolver
		if len(args) > 1 {
			server := args[1]
			r = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, server)
			}}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		ips, err := r.LookupHost(ctx, args[0])
		if err != nil {
			fmt.Println("ERROR", err)
			return
		}
		fmt.Println("ADDRS", strings.Join(ips, " "))
		return
	case "addrs":
		ifs, _ := net.Interfaces()
		for _, i := range ifs {
			as, _ := i.Addrs()
			for _, a := range as {
				fmt.Println(i.Name, a.String())
			}
		}
		return
	case "stat":
		for _, p := range args {
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				fmt.Printf("%s: %v\n", p, err)
				continue
			}
			fmt.Printf("%s %d:%d %o\n", p, st.Uid, st.Gid, st.Mode&0o7777)
		}
		return
	case "whoami":
		fmt.Println(os.Geteuid())
		return
	case "raw-socket":
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
		if err == nil {
			unix.Close(fd)
		}
		expectErr("raw socket", err)
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err == nil {
			unix.Close(fd)
		}
		expectErr("packet socket", err)
	case "network":
		ifs, _ := net.Interfaces()
		var names []string
		for _, i := range ifs {
			names = append(names, i.Name)
		}
		if len(ifs) != 1 || ifs[0].Name != "lo" {
			vulnerable("interfaces %v", names)
		} else {
			blocked("only interface is lo")
		}
		// TEST-NET-1: no route exists, so nothing is sent.
		c, err := net.DialTimeout("tcp", "192.0.2.1:80", 500*time.Millisecond)
		if c != nil {
			c.Close()
		}
		expectErr("connect 192.0.2.1:80", err)
	case "userns":
		expectErr("unshare(CLONE_NEWUSER)", unix.Unshare(unix.CLONE_NEWUSER))
		expectErr("unshare(CLONE_NEWNS)", unix.Unshare(unix.CLONE_NEWNS))
		_, _, e := unix.RawSyscall6(unix.SYS_CLONE, unix.CLONE_NEWUSER|uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
		expectErr("clone(CLONE_NEWUSER)", errnoErr(e))
		_, _, e = unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
		if e != unix.ENOSYS {
			vulnerable("clone3 answered %v, want ENOSYS", e)
		} else {
			blocked("clone3: ENOSYS")
		}
		expectErr("setns", unix.Setns(0, 0))
	case "keyctl":
		_, _, e := unix.Syscall6(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, uintptr(0xfffffffd), 0, 0, 0, 0)
		expectErr("keyctl", errnoErr(e))
		_, _, e = unix.Syscall(unix.SYS_ADD_KEY, 0, 0, 0)
		expectErr("add_key", errnoErr(e))
		_, _, e = unix.Syscall(unix.SYS_BPF, 0, 0, 0)
		expectErr("bpf", errnoErr(e))
		_, _, e = unix.Syscall6(unix.SYS_PERF_EVENT_OPEN, 0, 0, 0, 0, 0, 0)
		expectErr("perf_event_open", errnoErr(e))
		_, _, e = unix.Syscall(unix.SYS_USERFAULTFD, 0, 0, 0)
		expectErr("userfaultfd", errnoErr(e))
		_, _, e = unix.Syscall(unix.SYS_IO_URING_SETUP, 1, 0, 0)
		expectErr("io_uring_setup", errnoErr(e))
		_, _, e = unix.Syscall(unix.SYS_FINIT_MODULE, 0, 0, 0)
		expectErr("finit_module", errnoErr(e))
	case "tiocsti":
		c := byte('x')
		_, _, e := unix.Syscall(unix.SYS_IOCTL, 0, unix.TIOCSTI, uintptr(unsafe.Pointer(&c)))
		expectErr("ioctl(TIOCSTI)", errnoErr(e))
		_, _, e = unix.Syscall(unix.SYS_IOCTL, 0, 0xdead00000000|unix.TIOCSTI, uintptr(unsafe.Pointer(&c)))
		expectErr("ioctl(TIOCSTI with high bits)", errnoErr(e))
		if _, err := unix.IoctlGetTermios(0, unix.TCGETS); err != nil {
			vulnerable("stdin is not the sandbox's terminal: %v", err)
		}
	case "int80":
		// getpid through the i386 ABI: the filter kills the process.
		int80()
		vulnerable("i386 syscall returned")
	case "caps":
		b, _ := os.ReadFile("/proc/self/status")
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "Cap") || strings.HasPrefix(l, "NoNewPrivs") || strings.HasPrefix(l, "Seccomp:") {
				fmt.Println(l)
			}
		}
		return
	case "membomb":
		var hold [][]byte
		for {
			b := make([]byte, 64<<20)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1
			}
			hold = append(hold, b)
		}
	case "forkbomb":
		var n int
		for i := 0; i < 5000; i++ {
			cmd := exec.Command("/workspace/attack", "sleep")
			if err := cmd.Start(); err != nil {
				break
			}
			n++
		}
		fmt.Printf("started %d children\n", n)
		if n >= 5000 {
			vulnerable("no pids limit")
		} else {
			blocked("pids limit stopped the fork bomb after %d", n)
		}
	case "sleep":
		time.Sleep(time.Hour)
	case "fill":
		// args: path
		f, err := os.Create(args[0])
		if err != nil {
			vulnerable("create: %v", err)
			break
		}
		buf := make([]byte, 1<<20)
		var n int64
		for {
			w, err := f.Write(buf)
			n += int64(w)
			if err != nil {
				if errors.Is(err, syscall.ENOSPC) {
					blocked("ENOSPC after %d MiB", n>>20)
				} else {
					vulnerable("write failed with %v after %d MiB", err, n>>20)
				}
				break
			}
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown case", os.Args[1])
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

func fetch(u, caFile string, direct bool) {
	tr := &http.Transport{Proxy: http.ProxyFromEnvironment}
	if direct {
		tr.Proxy = nil
	}
	if caFile != "-" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			fmt.Println("ERROR", err)
			return
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		fmt.Println("ERROR", err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
	fmt.Println("STATUS", resp.StatusCode, strings.TrimSpace(string(b)))
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}
