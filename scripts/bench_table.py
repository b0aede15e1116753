#!/usr/bin/env python3
# bench_table.py TIMES [TARGET]: the table of the GPU validate scripts
# (gpu-validate-4bit-cold.sh, gpu-validate-4bit-memory.sh) from their
# times.txt, a line a run: "NAME WHO rROUND seconds peak_rss_kB rc=N", WHO
# cat, old or new. Per row and build: the median seconds, the median of the
# ratios to the same round's cat, peak RSS and whether every run exited 0;
# with TARGET, whether NEW's median ratio is within it. A round without a cat
# (a variant run once, such as --cpu-check none) is listed after, against the
# median cat of its row.
import sys, statistics, collections
target = float(sys.argv[2]) if len(sys.argv) > 2 else None
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, who, r, sec, rss, rc = line.split()
    rows[(name, r)].append((who, float(sec), int(rss) if rss.isdigit() else 0, rc))
res = collections.defaultdict(lambda: collections.defaultdict(list))
extra = []
for (name, r), runs in sorted(rows.items()):
    cat = [s for w, s, _, _ in runs if w == "cat"]
    if not cat:
        extra += [(name, r, w, s, rss, rc) for w, s, rss, rc in runs]
        continue
    for w, s, rss, rc in runs:
        res[name][w].append((s, s / cat[0], rss, rc))
for name in sorted(res):
    for w in ("cat", "old", "new"):
        v = res[name][w]
        if not v: continue
        ok = all(x[3] == "rc=0" for x in v)
        print(f"{name} {w:4s} median {statistics.median(x[0] for x in v):7.2f}s  x cat {statistics.median(x[1] for x in v):.2f} ({', '.join(f'{x[1]:.2f}' for x in v)})  peak RSS {max(x[2] for x in v)/1024:.0f} MB ({', '.join(f'{x[2]/1024:.0f}' for x in v)})  {'PASS' if ok else 'FAIL rc'}")
    new = res[name]["new"]
    if target is not None and new:
        ratio = statistics.median(x[1] for x in new)
        print(f"{name}: NEW x cat {ratio:.2f} -> {'PASS' if ratio <= target else 'FAIL'} (target <= {target})")
for name, r, w, s, rss, rc in extra:
    cats = [x[0] for x in res[name]["cat"]]
    print(f"{name} {w} {r} {s:.2f}s  x median cat {s / statistics.median(cats) if cats else float('nan'):.2f}  peak RSS {rss/1024:.0f} MB  {rc}")
