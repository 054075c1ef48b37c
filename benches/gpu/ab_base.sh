#!/usr/bin/env bash
# Before/after of this checkout's rrmm against an earlier commit's, on one GPU, in one run:
# W2 (Python DeviceBuffer round trip over a pool, RMM in every process as the control) and W7
# (threads on their own streams, rrmm's Rust bench), alternating processes. Everything lands in
# one file, $OUT/ab.txt (the device tool returns at most 8 files).
#   .gpu/wheels/rrmm-*.whl, .gpu/bench/w7            this checkout (scripts/gpu_prepare.sh)
#   .gpu/wheels-base/rrmm-*.whl, .gpu/bench-base/w7  the earlier commit's, built the same way
#   .whl/                                            RMM 26.10 (the control)
# Usage: OUT=dir benches/gpu/ab_base.sh [W2_ROUNDS] [W7_ROUNDS]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-out}"
W2_ROUNDS="${1:-5}"
W7_ROUNDS="${2:-2}"
mkdir -p "$OUT" /tmp/ab
python3 -m pip install -q --upgrade --no-deps --no-index --no-compile --target /tmp/site .gpu/wheels/*.whl .whl/*.whl
python3 -m pip install -q --upgrade --no-deps --no-index --no-compile --target /tmp/site-base .gpu/wheels-base/*.whl
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/ab.txt"
for i in $(seq 1 "$W2_ROUNDS"); do
  (cd benches/gpu && PYTHONPATH=/tmp/site-base:/tmp/site python3 w2.py --resources pool --reps 3 --out "/tmp/ab/w2_before_$i.json" > /dev/null)
  (cd benches/gpu && PYTHONPATH=/tmp/site python3 w2.py --resources pool --reps 3 --out "/tmp/ab/w2_after_$i.json" > /dev/null)
done
for i in $(seq 1 "$W7_ROUNDS"); do
  timeout 200 .gpu/bench-base/w7 > "/tmp/ab/w7_before_$i.jsonl" 2> /dev/null
  timeout 200 .gpu/bench/w7 > "/tmp/ab/w7_after_$i.jsonl" 2> /dev/null
done
python3 - "$W2_ROUNDS" "$W7_ROUNDS" >> "$OUT/ab.txt" <<'EOF'
import json, statistics, sys
from pathlib import Path
w2_rounds, w7_rounds = int(sys.argv[1]), int(sys.argv[2])
d = Path("/tmp/ab")
print(f"W2 pool round trip, ns, median of {w2_rounds} alternating processes per side "
      "(each the median of 3 reps); RMM runs in every process (control)")
print(f"{'size':>6} {'rrmm before':>12} {'rrmm after':>11} {'change':>7} {'RMM (b)':>9} {'RMM (a)':>9}")
rows = {}
for side in ("before", "after"):
    for i in range(1, w2_rounds + 1):
        p = d / f"w2_{side}_{i}.json"
        if not p.exists():
            continue
        for r in json.loads(p.read_text()):
            rows.setdefault((r["size"], r["impl"], side), []).append(r["ns"])
for size in ("1KiB", "1MiB", "64MiB"):
    m = {k: statistics.median(v) for k, v in rows.items() if k[0] == size}
    b, a = m.get((size, "rrmm", "before")), m.get((size, "rrmm", "after"))
    rb, ra = m.get((size, "rmm", "before")), m.get((size, "rmm", "after"))
    if b and a:
        print(f"{size:>6} {b:12.0f} {a:11.0f} {100 * (a / b - 1):+6.1f}% {rb or 0:9.0f} {ra or 0:9.0f}")
    print(f"   per round, rrmm before: {[round(x) for x in rows.get((size, 'rrmm', 'before'), [])]}"
          f" after: {[round(x) for x in rows.get((size, 'rrmm', 'after'), [])]}")
print(f"\nW7 threads (Mops/s, higher is better), best of {w7_rounds} alternating processes")
best = {}
for side in ("before", "after"):
    for i in range(1, w7_rounds + 1):
        p = d / f"w7_{side}_{i}.jsonl"
        if not p.exists():
            continue
        for line in p.read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("bench") == "threads":
                k = (r["resource"], r["threads"], side)
                best[k] = max(best.get(k, 0.0), r["mops_per_s"])
print(f"{'resource':>10} {'threads':>7} {'before':>9} {'after':>9} {'change':>7}")
for res, t in sorted({(k[0], k[1]) for k in best}):
    b, a = best.get((res, t, "before")), best.get((res, t, "after"))
    if b and a:
        print(f"{res:>10} {t:7d} {b:9.3f} {a:9.3f} {100 * (a / b - 1):+6.1f}%")
EOF
cat "$OUT/ab.txt"
