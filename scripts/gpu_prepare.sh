#!/usr/bin/env bash
# Makes every input of scripts/gpu_run.sh on a machine with Rust and network (the GPU machine has
# neither). Everything it writes is git-ignored and travels to the GPU machine as carried folders:
#   .gpu/wheels/rrmm-*.whl   rrmm's abi3 wheel (maturin build --release)
#   .gpu/rust/*              Rust GPU test binaries (cargo test --release --no-run), run --ignored
#   .gpu/examples/*          the crate's examples (cargo build --release --examples)
#   .gpu/bench/w7            rrmm's W7 benchmark binary (benches/w7.rs)
#   .gpu/bench/cuda_async_overhead  cuda_async's cost split, rrmm vs driver (benches/cuda_async_overhead.rs)
#   .whl/*.whl               RMM 26.10 (rmm-cu13, librmm-cu13, rapids-logger 0.3), the reference
#   .whl-dask/*.whl          dask, distributed, dask-cuda and what the GPU image lacks of their needs
#   .w9/                     rapids-singlecell's Harmony (W8/W9): the Harmony subpackage, its CUDA
#                            extensions and _utils, taken from the rapids-singlecell-cu13 wheel
#   .rmm-tests/              RMM's own Python tests (python/rmm/rmm/tests of rapidsai/rmm 26.10),
#                            copied from a checkout given as $RMM_SRC; never committed
# Usage: scripts/gpu_prepare.sh [wheel] [rust] [bench] [rmm] [dask] [w9] [rmmtests]  (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${*:-wheel rust bench rmm dask w9 rmmtests}"
has() { [[ " $STEPS " == *" $1 "* ]]; }
PIP_PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64
  --platform any)

if has wheel; then
  rm -rf .gpu/wheels && mkdir -p .gpu/wheels
  maturin build --release -o .gpu/wheels
fi

if has rust; then
  rm -rf .gpu/rust && mkdir -p .gpu/rust
  # Every integration-test binary with GPU tests (named gpu_*, and the conformance suite),
  # built in release.
  cargo test --release --no-run --message-format=json 2>/dev/null \
    | python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    exe = m.get("executable")
    if m.get("reason") == "compiler-artifact" and exe and (m["target"]["name"].startswith("gpu_") or m["target"]["name"] == "conformance"):
        shutil.copy(exe, ".gpu/rust/" + m["target"]["name"])
'
  ls .gpu/rust
  # The examples that need a GPU (they say so and exit 0 without one), run by stage examples.
  rm -rf .gpu/examples && mkdir -p .gpu/examples
  cargo build --release --examples
  for e in gpu_vector cudarc_kernel shared_pool_threads simulated_pool; do
    cp "${CARGO_TARGET_DIR:-target}/release/examples/$e" .gpu/examples/
  done
fi

if has bench; then
  mkdir -p .gpu/bench
  for b in w7 cuda_async_overhead; do
    cargo build --release --bench "$b" --message-format=json 2>/dev/null \
      | python3 -c '
import json, shutil, sys
name = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == name:
        shutil.copy(m["executable"], ".gpu/bench/" + name)
' "$b"
  done
fi

if has rmm; then
  mkdir -p .whl
  python3 -m pip download -q --no-deps "${PIP_PLATFORM[@]}" -d .whl \
    "rmm-cu13==26.10.*" "librmm-cu13==26.10.*" "rapids-logger==0.3.*"
fi

if has dask; then
  mkdir -p .whl-dask
  # The GPU image has numpy, pandas, cupy, numba, cloudpickle, toolz, pyyaml, psutil, msgpack,
  # sortedcontainers, jinja2, click, fsspec, packaging, nvidia-ml-py, tornado is checked there.
  python3 -m pip download -q --no-deps "${PIP_PLATFORM[@]}" -d .whl-dask \
    dask distributed dask-cuda partd locket tblib zict tornado urllib3 \
    importlib-metadata zipp pynvml
fi

if has w9; then
  # Only what rapids_singlecell.preprocessing._harmony imports (the whole wheel is 22 MB, over
  # what a GPU call carries beside the rest); benches/gpu/w8_w9.py loads it without the package
  # __init__ (which needs cuML).
  tmp="$(mktemp -d)"
  python3 -m pip download -q --no-deps "${PIP_PLATFORM[@]}" -d "$tmp" "rapids-singlecell-cu13==0.18.*"
  (cd "$tmp" && python3 -m zipfile -e rapids_singlecell*.whl x)
  rm -rf .w9 && mkdir -p .w9
  (cd "$tmp/x" && cp --parents rapids_singlecell/_cuda/__init__.py rapids_singlecell/_cuda/_harmony*.so \
     rapids_singlecell/_utils/*.py rapids_singlecell/preprocessing/_harmony/*.py "$OLDPWD/.w9/")
  rm -rf "$tmp"
fi

if has rmmtests; then
  if [ -n "${RMM_SRC:-}" ]; then
    rm -rf .rmm-tests && mkdir -p .rmm-tests
    cp -r "$RMM_SRC/python/rmm/rmm/tests/." .rmm-tests/
  else
    echo "rmmtests: set RMM_SRC to a checkout of rapidsai/rmm (branch-26.10) to copy its tests"
  fi
fi
du -sh .gpu .whl .whl-dask .w9 .rmm-tests 2>/dev/null || true
