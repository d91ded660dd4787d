#!/usr/bin/env python3
"""Restore a capture into a fresh QEMU 10.0 (anon RAM) and check the guest runs.
usage: restore.py FILE caps(comma) [qemu 7|10]"""
import json, os, socket, subprocess, sys, time
D = os.environ.get("QEMU10_EVAL_DIR", "/tmp/qemu10-eval")
KERNEL = os.environ.get("NETHER_GUEST_KERNEL", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "guest", "vmlinux")); f_in, caps = sys.argv[1], [c for c in sys.argv[2].split(",") if c]
ver = sys.argv[3] if len(sys.argv) > 3 else "10"
sock = D + "/qmp-r.sock"; serial = D + "/serial-restore.log"
for p in (sock, serial):
    if os.path.exists(p): os.unlink(p)
cmd = ([D + "/root/usr/bin/qemu-system-x86_64", "-L", D + "/root/usr/share/qemu", "-L", D + "/root/usr/share/seabios"] if ver == "10" else ["/usr/bin/qemu-system-x86_64"])
cmd += ["-nodefaults", "-display", "none", "-accel", "tcg", "-cpu", "max", "-smp", "1",
        "-kernel", KERNEL, "-initrd", D + "/initrd.cpio", "-append", "console=ttyS0 quiet",
        "-serial", "file:" + serial, "-qmp", "unix:%s,server,wait=off" % sock, "-machine", "pc", "-m", "512", "-incoming", "defer"]
q = subprocess.Popen(cmd, stdout=open(D + "/qemu-restore.out", "w"), stderr=subprocess.STDOUT)
try:
    for _ in range(100):
        if os.path.exists(sock): break
        time.sleep(0.1)
    s = socket.socket(socket.AF_UNIX); s.connect(sock); f = s.makefile("rwb"); f.readline()
    def qmp(c, a=None):
        m = {"execute": c}
        if a is not None: m["arguments"] = a
        f.write((json.dumps(m) + "\n").encode()); f.flush()
        while True:
            r = json.loads(f.readline())
            if "event" not in r: return r
    qmp("qmp_capabilities")
    if caps: print(qmp("migrate-set-capabilities", {"capabilities": [{"capability": c, "state": True} for c in caps]}))
    uri = "file:" + f_in if ver == "10" else "exec:cat " + f_in
    t0 = time.time(); print(qmp("migrate-incoming", {"uri": uri}))
    while True:
        st = qmp("query-status")["return"]["status"]
        if st not in ("inmigrate",): break
        time.sleep(0.02)
    print("status after load:", st, "load wall %.3fs" % (time.time() - t0), qmp("query-migrate")["return"].get("status"))
    print(qmp("cont")); time.sleep(4)
    print("serial after restore+4s:", open(serial, "rb").read().decode(errors="replace").split())
finally:
    q.kill(); q.wait()
