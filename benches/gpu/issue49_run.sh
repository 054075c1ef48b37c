#!/usr/bin/env bash
# Issue 49's GPU run, on the GPU machine (no Rust there: the wheel comes from
# `scripts/gpu_prepare.sh wheel`; dask's wheels from `scripts/gpu_prepare.sh dask` in .whl-dask;
# cuda.core's in .whl-cc, from `pip download cuda-core cuda-bindings cuda-pathfinder`).
# Stages, in the order given:
#   env      whether the driver exports shareable handles as file descriptors, cuda.core's
#            presence, free device and host memory
#   tests    tests/python/test_gpu_share.py (3 importers bit-exact, a free that waits; sleep,
#            wake and attach again; kill -9 and adoption)
#   docs     docs/sharing.md's scripts (the weight cache, a worker, Dask)
#   attach   benches/gpu/share_attach.py: 20 GB in 5,000 arrays, every case
#   big      the same, 60 GB in 10,000 arrays
#   dask     benches/gpu/dask_share.py: two Dask workers on one GPU, 2-8 GiB arrays between
#            them, with and without the attach path
# Usage: OUT=dir benches/gpu/issue49_run.sh STAGE...
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
pip install -q --no-deps --no-index --target /tmp/site .gpu/wheels/*.whl 2>&1 | tail -2
# Python files newer than the wheel (a change that needs no Rust) replace the wheel's.
cp python/rrmm/*.py /tmp/site/rrmm/ 2>/dev/null
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
if [[ -d .whl-dask ]] && ! python3 -c "import distributed" 2>/dev/null; then
  pip install -q --no-deps --no-index --target /tmp/site-dask .whl-dask/*.whl 2>&1 | tail -2
  export PYTHONPATH="$PYTHONPATH:/tmp/site-dask"
fi
if [[ -d .whl-cc ]] && ! python3 -c "import cuda.core" 2>/dev/null; then
  # cuda.bindings of the image, where it has one, stays (CuPy and PyTorch use it).
  wheels=(.whl-cc/cuda_core-*.whl)
  python3 -c "import cuda.bindings" 2>/dev/null || wheels+=(.whl-cc/cuda_bindings-*.whl)
  python3 -c "import cuda.pathfinder" 2>/dev/null || wheels+=(.whl-cc/cuda_pathfinder-*.whl)
  pip install -q --no-deps --no-index --target /tmp/site-cc "${wheels[@]}" 2>&1 | tail -2
  export PYTHONPATH="$PYTHONPATH:/tmp/site-cc"
fi
for stage in "$@"; do
  echo "== $stage $(date +%T)"
  case "$stage" in
    env)
      nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
      free -g | head -2
      python3 - <<'EOF' 2>&1 | tee "$OUT/env.txt"
import rrmm.mr
try:
    pool = rrmm.mr.ExpandableMemoryResource(shareable=True)
    print("shareable pool:", pool.page_size(), "byte pages; file descriptors exported: yes")
except Exception as e:
    print("shareable pool refused:", e)
try:
    import cuda.core as cc
    print("cuda.core", getattr(cc, "__version__", "?"))
except Exception as e:
    print("cuda.core missing:", e)
EOF
      ;;
    tests)
      python3 -m pytest -q -s -rs -p no:cacheprovider tests/python/test_gpu_share.py \
        > "$OUT/gpu_share_tests.log" 2>&1
      tail -40 "$OUT/gpu_share_tests.log" ;;
    docs)
      python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_docs_scripts.py -k sharing \
        2>&1 | tail -15 | tee "$OUT/docs_sharing.log" ;;
    attach)
      timeout 500 python3 benches/gpu/share_attach.py | tee "$OUT/share_attach.jsonl" ;;
    big)
      timeout 500 python3 benches/gpu/share_attach.py --big | tee "$OUT/share_attach_big.jsonl" ;;
    dask)
      timeout 300 python3 benches/gpu/dask_share.py --out "$OUT/dask_share.json" 2>&1 \
        | tail -30 | tee "$OUT/dask_share.txt" ;;
    *) echo "unknown stage $stage" ;;
  esac
done
echo "== done $(date +%T)"
