#!/usr/bin/env bash
# Issue 37 on one GPU: W11 (benches/gpu/scale.py) for the host tier - a device pool, then a pool
# of pinned host memory whose ranges come from the process's host page supply - with its host
# pages made at start-up (the host pool's initial size: the bytes beyond the device, plus 15% of
# the device) and on demand (initial size 0), beside rrmm's and RMM's managed pools, at
# F = W11_FS (default 1.15,1.5,2.0). Writes $OUT/w11_tier.txt and $OUT/w11_tier.jsonl.
set -uo pipefail
cd "$(dirname "$0")"
OUT="${OUT:-$PWD/gpu-out}"
F='float(__import__("sys").argv[__import__("sys").argv.index("--f")+1])'
T='__import__("cupy").cuda.Device().mem_info[1]'
HOST="(int(max(0.05, $F - 0.85) * $T) // 256 * 256)"
DEV='mr.PoolMemoryResource(mr.CudaMemoryResource(), initial_pool_size=0)'
AHEAD="rrmm:expr=mr.TieredMemoryResource($DEV, [mr.PoolMemoryResource(mr.PinnedHostMemoryResource(), initial_pool_size=$HOST)], names=['host'])"
DEMAND="rrmm:expr=mr.TieredMemoryResource($DEV, [mr.PoolMemoryResource(mr.PinnedHostMemoryResource(), initial_pool_size=0)], names=['host'])"
timeout 560 python3 scale.py --all --fs "${W11_FS:-1.15,1.5,2.0}" \
  --setups "$AHEAD;$DEMAND;rrmm:managed_pool;rmm:managed_pool" --out "$OUT/w11_tier.jsonl" \
  > "$OUT/w11_tier.txt" 2>&1
tail -25 "$OUT/w11_tier.txt"
