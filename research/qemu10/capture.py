#!/usr/bin/env python3
"""Launch one QEMU, wait for guest FILL_DONE, do N captures via QMP, kill QEMU.
usage: capture.py --qemu {7,10} --ram {anon,memfd} --tag X [--caps a,b] [--params JSON] [--stopped] [--n 3]
"""
import argparse, json, os, socket, subprocess, sys, time
D = os.environ.get("QEMU10_EVAL_DIR", "/tmp/qemu10-eval")
KERNEL = os.environ.get("NETHER_GUEST_KERNEL", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "guest", "vmlinux"))
ap = argparse.ArgumentParser()
ap.add_argument("--qemu", required=True); ap.add_argument("--ram", default="anon")
ap.add_argument("--tag", required=True); ap.add_argument("--caps", default="")
ap.add_argument("--params", default="{}"); ap.add_argument("--stopped", action="store_true")
ap.add_argument("--n", type=int, default=3)
ap.add_argument("--outdir", default=D)
ap.add_argument("--strace", action="store_true")
ap.add_argument("--exec", action="store_true", help="use exec:cat > FILE even on 10.0")
a = ap.parse_args()
sock = D + "/qmp.sock"; serial = D + "/serial-%s.log" % a.tag
for p in (sock, serial):
    if os.path.exists(p): os.unlink(p)
env = dict(os.environ)
if a.qemu == "10":
    cmd = [D + "/root/usr/bin/qemu-system-x86_64", "-L", D + "/root/usr/share/qemu", "-L", D + "/root/usr/share/seabios"]
else:
    cmd = ["/usr/bin/qemu-system-x86_64"]
cmd += ["-nodefaults", "-display", "none", "-accel", "tcg", "-cpu", "max", "-smp", "1",
        "-kernel", KERNEL, "-initrd", D + "/initrd.cpio",
        "-append", "console=ttyS0 quiet", "-serial", "file:" + serial,
        "-qmp", "unix:%s,server,wait=off" % sock]
if a.ram == "memfd":
    cmd += ["-machine", "pc,memory-backend=ram0", "-m", "512",
            "-object", "memory-backend-memfd,id=ram0,size=512M,share=on"]
elif a.ram == "file":
    cmd += ["-machine", "pc,memory-backend=ram0", "-m", "512",
            "-object", "memory-backend-file,id=ram0,size=512M,share=on,mem-path=/dev/shm/qemu10-eval-ram"]
else:
    cmd += ["-machine", "pc", "-m", "512"]
if a.strace:
    cmd = ["strace", "-f", "-tt", "-T", "-o", D + "/strace-%s.txt" % a.tag, "-e", "trace=fsync,fdatasync,syncfs,sync_file_range,ftruncate,fallocate,close,openat"] + cmd
print("CMD:", " ".join(cmd), flush=True)
q = subprocess.Popen(cmd, stdout=open(D + "/qemu-%s.out" % a.tag, "w"), stderr=subprocess.STDOUT)
print("qemu pid", q.pid, flush=True)
try:
    t0 = time.time()
    while True:
        if q.poll() is not None: sys.exit("qemu exited rc=%s" % q.returncode)
        if os.path.exists(serial) and b"FILL_DONE" in open(serial, "rb").read(): break
        if time.time() - t0 > 600: sys.exit("timeout waiting FILL_DONE")
        time.sleep(0.5)
    print("FILL_DONE after %.1fs" % (time.time() - t0), flush=True)
    time.sleep(2)
    s = socket.socket(socket.AF_UNIX); s.connect(sock); f = s.makefile("rwb")
    json.loads(f.readline())
    def qmp(cmd, args=None, ok_err=False):
        m = {"execute": cmd}
        if args is not None: m["arguments"] = args
        f.write((json.dumps(m) + "\n").encode()); f.flush()
        while True:
            r = json.loads(f.readline())
            if "event" in r:
                if r["event"] in ("STOP", "RESUME"):
                    ev.append((r["event"], r["timestamp"]["seconds"] + r["timestamp"]["microseconds"] / 1e6))
                continue
            if "error" in r:
                print("QMP ERROR for %s %s: %s" % (cmd, json.dumps(args), json.dumps(r["error"])), flush=True)
                if not ok_err: raise SystemExit(1)
            return r
    ev = []
    qmp("qmp_capabilities")
    caps = [c for c in a.caps.split(",") if c]
    if caps:
        r = qmp("migrate-set-capabilities", {"capabilities": [{"capability": c, "state": True} for c in caps]}, ok_err=True)
        if "error" in r: raise SystemExit(2)
    params = {"downtime-limit": 5, "max-bandwidth": 10 * 1000 * 1000 * 1000}
    params.update(json.loads(a.params))
    qmp("migrate-set-parameters", params)
    print("caps now:", [c["capability"] for c in qmp("query-migrate-capabilities")["return"] if c["state"]], flush=True)
    print("params:", json.dumps({k: v for k, v in qmp("query-migrate-parameters")["return"].items() if k in ("downtime-limit", "max-bandwidth", "multifd-channels")}), flush=True)
    results = []
    for i in range(1, a.n + 1):
        out = "%s/%s.%d" % (a.outdir, a.tag, i)
        if os.path.exists(out): os.unlink(out)
        uri = ("exec:cat > " + out) if (a.qemu == "7" or a.exec) else ("file:" + out)
        ticks_before = open(serial, "rb").read().count(b"tick")
        def rss():
            d = {}
            for l in open("/proc/%d/status" % q.pid):
                if l.startswith(("VmRSS", "RssAnon", "RssShmem")): d[l.split(":")[0]] = int(l.split()[1]) // 1024
            return d
        rss0 = rss()
        if a.stopped: qmp("stop")
        tw = time.time()
        qmp("migrate", {"uri": uri})
        while True:
            r = qmp("query-migrate")["return"]
            if r.get("status") in ("completed", "failed", "cancelled"): break
            time.sleep(0.01)
        t_done = time.time(); wall = t_done - tw
        st = qmp("query-status")["return"]["status"]
        t_cont0 = time.time(); qmp("cont"); t_cont1 = time.time()
        qmp("query-status")  # drain RESUME event
        stops = [t for e, t in ev if e == "STOP"]; res = [t for e, t in ev if e == "RESUME"]
        pause = round((res[-1] - stops[0]) * 1000, 1) if stops and res else None
        split = {"stop_to_seen_completed_ms": round((t_done - stops[0]) * 1000, 1) if stops else None,
                 "cont_rtt_ms": round((t_cont1 - t_cont0) * 1000, 1),
                 "resume_event_after_cont_sent_ms": round((res[-1] - t_cont0) * 1000, 1) if res else None}
        ev.clear()
        time.sleep(0.3)  # let exec:cat flush/close
        size = os.path.getsize(out); blocks = os.stat(out).st_blocks * 512
        du = subprocess.run(["du", "-k", out], capture_output=True, text=True).stdout.split()[0]
        rec = {"run": i, "status": r.get("status"), "downtime_ms": r.get("downtime"), "total_ms": r.get("total-time"),
               "setup_ms": r.get("setup-time"), "wall_s": round(wall, 3), "state_after": st,
               "file_bytes": size, "alloc_bytes": blocks, "du_k": du,
               "ram_transferred": r.get("ram", {}).get("transferred"), "dirty_sync": r.get("ram", {}).get("dirty-sync-count"),
               "ram_iterations_pages": r.get("ram", {}).get("normal"), "error": r.get("error-desc"), "rssMiB_before": rss0, "rssMiB_after": rss()}
        rec["stop_to_resume_ms"] = pause; rec.update(split)
        print("RESULT", json.dumps(rec), flush=True); results.append(rec)
        time.sleep(2.5)
        print("  guest ticks advanced after cont: %d -> %d" % (ticks_before, open(serial, "rb").read().count(b"tick")), flush=True)
    json.dump(results, open("%s/results-%s.json" % (D, a.tag), "w"), indent=1)
finally:
    q.kill(); q.wait(); print("qemu killed", flush=True)
