#!/usr/bin/env python3
# builds initrd.cpio (newc) from ./initrd without needing cpio(1)
import os, sys, stat
root = sys.argv[1]; out = sys.argv[2]
ino = [1000]
def hdr(name, mode, size, nlink=1):
    ino[0] += 1
    f = "070701" + "".join("%08X" % v for v in [ino[0], mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, len(name)+1, 0])
    return f.encode() + name.encode() + b"\0"
def pad(n): return b"\0" * ((4 - n % 4) % 4)
with open(out, "wb") as o:
    for dp, dns, fns in os.walk(root):
        for n in sorted(dns) + sorted(fns):
            p = os.path.join(dp, n); rel = os.path.relpath(p, root)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode): data = os.readlink(p).encode()
            elif stat.S_ISREG(st.st_mode): data = open(p, "rb").read()
            else: data = b""
            h = hdr(rel, st.st_mode, len(data)); o.write(h + pad(len(h)) + data + pad(len(data)))
    h = hdr("TRAILER!!!", 0, 0); o.write(h + pad(len(h)))
