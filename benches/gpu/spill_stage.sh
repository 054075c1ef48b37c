#!/usr/bin/env bash
# Issue 37's spill and promotion on one GPU: installs the carried wheels, runs the GPU tests of
# spilling (test_gpu_spill.py), times the making of host pages ahead on 1 and 16 threads, then
# spill_promote.py at F = $SPILL_FS (default 1.15) for $SPILL_SETUPS. Writes under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
python3 -m pip install -q --upgrade --no-deps --no-index --no-compile --target /tmp/site \
  .gpu/wheels/*.whl .whl/*.whl > "$OUT/pip.txt" 2>&1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
free -g | tee -a "$OUT/gpu.txt"
if [ "${SPILL_TESTS:-1}" = 1 ]; then
  (cd tests/python && timeout 300 python3 -m pytest -q -p no:cacheprovider test_gpu_spill.py \
    test_spill.py 2>&1 | tail -15) | tee "$OUT/tests.txt"
  timeout 120 python3 - <<'PY' 2>&1 | tee "$OUT/make_rate.txt"
import time
from rrmm import mr
GiB = 1 << 30
for threads in (1, 4, 16):
    pool = mr.ExpandableMemoryResource(spill_to_host=16 * GiB)
    t0 = time.perf_counter()
    made = pool.prepare_spill(8 * GiB, threads=threads)
    s = time.perf_counter() - t0
    print(f"threads {threads:2}: made {made / GiB:.0f} GiB in {s:.2f} s = {made / s / 1e9:.1f} GB/s")
    del pool
PY
fi
timeout "${SPILL_TIMEOUT:-480}" python3 benches/gpu/spill_promote.py --all --fs "${SPILL_FS:-1.15}" \
  --setups "${SPILL_SETUPS:-spill,spill_no_promote,tier,rrmm_managed_pool,rmm_managed_pool}" \
  --timeout 100 --out "$OUT/spill_promote.jsonl" 2>&1 | tee "$OUT/spill_promote.txt" | tail -12
