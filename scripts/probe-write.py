#!/usr/bin/env python3
"""Write TOTAL MiB of random bytes to a new file and time it: the probe behind
BENCHMARKS.md, issue 12, seventh pass (page cache against O_DIRECT on this VM).

  scripts/probe-write.py OUT TOTAL_MB buffered|direct [PIECE_KB] [THREADS]

buffered: pwrite from one 4 MiB buffer in PIECE pieces (default 4096 KiB), one thread.
direct:   O_DIRECT pwrite of PIECE pieces from page-aligned buffers, THREADS at once (default 1).
Prints the seconds writing, the process's system seconds, and the seconds fsync took.
Drop the page cache and wait a few seconds before each run (as root:
sync; sleep 4; echo 3 > /proc/sys/vm/drop_caches).
"""
import mmap, os, resource, sys, threading, time

out, total, mode = sys.argv[1], int(sys.argv[2]) << 20, sys.argv[3]
piece = int(sys.argv[4]) << 10 if len(sys.argv) > 4 else 4 << 20
threads = int(sys.argv[5]) if len(sys.argv) > 5 else 1
flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if mode == "direct" else 0)
fd = os.open(out, flags, 0o644)
n = total // piece
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.time()

def buffered():
    buf = memoryview(os.urandom(4 << 20))
    for i in range(n):
        p = (i * piece) % (4 << 20)
        os.pwrite(fd, buf[p:p + piece], i * piece)

def direct(k):
    buf = mmap.mmap(-1, piece)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(piece))
    for i in range(k, n, threads):
        os.pwrite(fd, buf, i * piece)

if mode == "direct":
    ts = [threading.Thread(target=direct, args=(k,)) for k in range(threads)]
    [t.start() for t in ts]
    [t.join() for t in ts]
else:
    buffered()
r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.time()
os.fsync(fd)
t2 = time.time()
print(f"{mode} piece {piece >> 10} KiB threads {threads}: write {t1 - t0:.2f} s, system {r1.ru_stime - r0.ru_stime:.2f} s, fsync {t2 - t1:.2f} s, total {t2 - t0:.2f} s")
