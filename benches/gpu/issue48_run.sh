#!/usr/bin/env bash
# Issue 48's GPU run, on the GPU machine (no Rust there: the wheel comes from
# `scripts/gpu_prepare.sh wheel`, RMM's from .whl/). Stages, in the order given:
#   probe    what each driver call of a promotion costs (probe_remap_cost.cu, 128 MiB pages)
#   tests    tests/python/test_gpu_spill.py and test_gpu_movers.py
#   split    W11 at F = 0.9 with the fill split into allocations and writes (W11_SPLIT=1):
#            the device pool, rrmm's and RMM's managed pools (the managed first touch's profile)
#   within   W11 at F = 0.5 and 0.9: the device pool, any_size (plain and at rest), rrmm's and
#            RMM's managed pools
#   beyond   W11 at F = 1.15 and 1.5: any_size (plain, at rest, frees), the spilling pool with
#            prepare_spill, the host tier
# Usage: OUT=dir benches/gpu/issue48_run.sh STAGE...
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
pip install -q --no-deps --no-index --target /tmp/site .gpu/wheels/*.whl .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
W11=(python3 benches/gpu/spill_promote.py --all --timeout 150)
for stage in "$@"; do
  echo "== $stage $(date +%T)"
  case "$stage" in
    probe)
      nvcc -O2 -arch=sm_90 -o /tmp/remap benches/gpu/probe_remap_cost.cu -lcuda \
        && /tmp/remap 64 | tee "$OUT/remap_cost.jsonl" ;;
    tests)
      python3 -m pytest -q -p no:cacheprovider tests/python/test_gpu_spill.py \
        tests/python/test_gpu_movers.py 2>&1 | tail -15 | tee "$OUT/gpu_tests.log" ;;
    split)
      W11_SPLIT=1 "${W11[@]}" --fs 0.9 --setups rrmm_pool,rrmm_managed_pool,rmm_managed_pool \
        --out "$OUT/w11_split.jsonl" | tail -5 | tee "$OUT/w11_split.txt" ;;
    within)
      "${W11[@]}" --fs 0.5,0.9 \
        --setups rrmm_pool,any_size,any_size_at_rest,rrmm_managed_pool,rmm_managed_pool \
        --out "$OUT/w11_within.jsonl" | tail -12 | tee "$OUT/w11_within.txt" ;;
    beyond)
      "${W11[@]}" --fs 1.15,1.5 --setups any_size,any_size_at_rest,any_size_frees,spill,tier \
        --out "$OUT/w11_beyond.jsonl" | tail -12 | tee "$OUT/w11_beyond.txt" ;;
    *) echo "unknown stage $stage" ;;
  esac
done
echo "== done $(date +%T)"
