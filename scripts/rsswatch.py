#!/usr/bin/env python3
"""rsswatch.py PID OUTPREFIX: sample a process's memory every 20 ms until it
exits; at each new peak of VmRSS (2% over the last one) read /proc/PID/smaps
and keep that breakdown. Writes OUTPREFIX.txt: the peak's status lines, RSS
by kind of mapping, the pass's buffers by size, and the 12 largest mappings.

Kinds: hugepage-anon (anonymous with the hg flag: validate/stream's O_DIRECT
buffers, madvised MADV_HUGEPAGE), nvidia (mappings of /dev/nvidia*: pinned
host memory and the driver's), anon-locked/io (anonymous with Locked pages
or the io/pf flags: pinned host memory the driver maps anonymously),
anon-other (the Go heap, whose size gctrace gives, the driver's own, stacks),
file (libraries, the binary).
"""
import os, sys, time

pid, prefix = int(sys.argv[1]), sys.argv[2]


def child(p):
    try:
        kids = open(f"/proc/{p}/task/{p}/children").read().split()
    except OSError:
        return None
    return int(kids[0]) if kids else None


# PID may be a wrapper (time, timeout, bash): watch the first descendant
# that is none of them.
for _ in range(200):
    try:
        comm = open(f"/proc/{pid}/comm").read().strip()
    except OSError:
        sys.exit(0)
    if comm not in ("time", "timeout", "bash", "sh", "env", "nice"):
        break
    c = child(pid)
    if c is None:
        time.sleep(0.01)
        continue
    pid = c


def status():
    d = {}
    try:
        for l in open(f"/proc/{pid}/status"):
            k, _, v = l.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem", "VmPin", "VmLck", "Threads"):
                d[k] = int(v.split()[0])
    except OSError:
        return None
    return d


def smaps():
    maps, cur = [], None
    try:
        lines = open(f"/proc/{pid}/smaps").read().splitlines()
    except OSError:
        return None
    for l in lines:
        f = l.split()
        if not f:
            continue
        if "-" in f[0] and not f[0].endswith(":"):
            lo, hi = (int(x, 16) for x in f[0].split("-"))
            cur = {"lo": lo, "hi": hi, "name": f[5] if len(f) > 5 else "", "flags": ""}
            maps.append(cur)
        elif f[0] == "VmFlags:":
            cur["flags"] = " ".join(f[1:])
        elif f[0].endswith(":") and len(f) >= 2 and f[1].isdigit():
            cur[f[0][:-1]] = int(f[1])
    return maps


def kind(m):
    name, flags = m["name"], m["flags"].split()
    if name.startswith("/dev/nvidia"):
        return "nvidia"
    if name and not name.startswith("["):
        return "file"
    if "hg" in flags:
        return "hugepage-anon"
    if m.get("Locked", 0) > 0 or "lo" in flags or "io" in flags or "pf" in flags:
        return "anon-locked/io"
    return "anon-other"  # the Go heap (gctrace says how much), the driver's, stacks


peak, best, series = 0, None, []
t0 = time.time()
while True:
    s = status()
    if s is None:
        break
    series.append((time.time() - t0, s.get("VmRSS", 0)))
    if s.get("VmRSS", 0) > peak * 1.02:
        m = smaps()
        if m is not None:
            peak, best = s["VmRSS"], (time.time() - t0, s, m)
    time.sleep(0.02)

with open(prefix + ".txt", "w") as out:
    if best is None:
        print("no sample", file=out)
        sys.exit(0)
    at, s, m = best
    print(f"peak sample at {at:.2f}s: " + " ".join(f"{k} {v // 1024} MB" for k, v in s.items() if k != "Threads"), file=out)
    by = {}
    for x in m:
        k = kind(x)
        r = by.setdefault(k, [0, 0, 0])
        r[0] += x.get("Rss", 0)
        r[1] += x.get("AnonHugePages", 0)
        r[2] += 1
    for k, (rss, huge, n) in sorted(by.items(), key=lambda kv: -kv[1][0]):
        print(f"  {k:16s} {rss // 1024:6d} MB rss ({huge // 1024} MB in huge pages, {n} mappings)", file=out)
    hist = {}
    for x in m:
        if kind(x) == "hugepage-anon":
            h = hist.setdefault((x["hi"] - x["lo"]) >> 20, [0, 0])
            h[0] += 1
            h[1] += x.get("Rss", 0)
    print("  hugepage-anon by mapping size (MB size: count, MB rss): " + ", ".join(f"{k}: {c}, {r // 1024}" for k, (c, r) in sorted(hist.items())), file=out)
    print("  largest mappings (MB rss, MB size, kind, name, flags):", file=out)
    for x in sorted(m, key=lambda x: -x.get("Rss", 0))[:12]:
        print(f"    {x.get('Rss', 0) // 1024:6d} {(x['hi'] - x['lo']) >> 20:7d} {kind(x):14s} {x['lo']:x} {x['name']} [{x['flags']}]", file=out)
    # the RSS over time, 10 points
    n = len(series)
    pts = [series[min(n - 1, i * n // 10)] for i in range(10)] + [series[-1]]
    print("  VmRSS over time: " + ", ".join(f"{t:.1f}s {r // 1024}" for t, r in pts), file=out)
