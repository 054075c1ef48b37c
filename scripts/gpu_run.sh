#!/usr/bin/env bash
# The whole GPU run, on the GPU machine, from artifacts built elsewhere (that machine has no Rust):
#   .gpu/wheels/rrmm-*.whl        the abi3 wheel (maturin build --release)
#   .gpu/rust/*                   Rust GPU test binaries (cargo test --release --no-run)
#   .gpu/bench/w7                 rrmm's W7 benchmark (cargo build --release --bench w7, then copy
#                                 target/release/deps/w7-<hash>; scripts/gpu_prepare.sh bench)
#   .gpu/bench/cuda_async_overhead  stage asyncw1's split of cuda_async's W1 time (same way)
#   .whl/*.whl                    RMM 26.10 wheels (rmm-cu13, librmm-cu13, rapids-logger), reference
#   .rmm-tests/*.py               RMM's own Python tests (stage rmmtests; see scripts/rmm_tests.md)
#   .whl-dask/*.whl               dask, distributed, dask-cuda and their missing deps (stage dask)
# Usage: scripts/gpu_run.sh [STAGE...]
#   stages: rust examples peers python sanitizer w1 w2 w2base w3 w7 hooks profile rmmtests dask cupythreads asyncw1
#           asyncsplit w9 w8 w10 sleep soak engines history shared tms vllm firstsleep
#   (default: rust python w1 w2 w3 w7 hooks profile)
#   sanitizer: the Rust GPU tests (.gpu/rust/gpu_*, conformance) and SANITIZER_PYTEST (a short
#   pytest subset) under compute-sanitizer --tool memcheck; RRMM_STRESS_PERCENT (default 25 there)
#   scales the stress tests' rounds. The summary gives the error count of each.
#   PYTEST_ARGS (e.g. test files) and HOOKS_ARGS (e.g. "--only cupy") narrow the python and
#   hooks stages; W2_RESOURCES (e.g. "cuda_async,pool") the w2 stage.
# Writes logs and JSON under $OUT (or ./gpu-out) and prints a summary table last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
STAGES="${*:-rust python w1 w2 w3 w7 hooks profile}"
export PYTHONUNBUFFERED=1
export RRMM_TRACES="$PWD/python/rrmm/traces"
SITE=/tmp/site
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

note() { echo "$*" | tee -a "$SUMMARY"; }

python3 -m pip install -q --upgrade --no-deps --no-index --no-compile --target "$SITE" $(ls .gpu/wheels/*.whl .whl/*.whl 2>/dev/null) \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="$SITE"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
note "GPU: $(head -1 "$OUT/gpu.txt")"

has() { [[ " $STAGES " == *" $1 "* ]]; }

# /tmp/site as a site directory (its .pth files run, as in a real install: the RRMM_AS_RMM hook).
alias_site() {
  mkdir -p /tmp/alias_site
  echo "import site; site.addsitedir('$SITE')" > /tmp/alias_site/sitecustomize.py
  echo "/tmp/alias_site:$PYTHONPATH"
}

if has rust; then
  echo "== Rust GPU tests"
  status=0
  for t in .gpu/rust/*; do
    "$t" --ignored --test-threads=1 2>&1 | tee -a "$OUT/rust.log" | grep -E "^test |test result" || status=1
  done
  note "rust gpu tests: $(grep -c '\.\.\. ok' "$OUT/rust.log") ok, $(grep -c 'FAILED' "$OUT/rust.log") failed"
fi

if has examples; then
  echo "== the crate's examples on the GPU"
  status=0
  for e in .gpu/examples/*; do
    echo "-- $(basename "$e")"; "$e" || status=1
  done 2>&1 | tee "$OUT/examples.log"
  note "examples: $(grep -c '^-- ' "$OUT/examples.log") run; $(grep -ciE 'panicked|error' "$OUT/examples.log") error lines"
fi

if has peers; then
  echo "== rrmm replay against PyTorch's and CuPy's allocators (shipped transformer log)"
  (cd /tmp && python3 -m rrmm replay transformer_training --compare pool,expandable,torch,cupy --fit 2>&1) \
    | tee "$OUT/peers.txt"
  (cd /tmp && python3 -m rrmm replay transformer_training --compare pool,expandable,torch,cupy --json) \
    > "$OUT/peers.json" 2> "$OUT/peers.err"
  note "$(cat "$OUT/peers.txt")"
fi

if has sanitizer; then
  echo "== compute-sanitizer memcheck"
  SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
  if [ -z "$SAN" ]; then
    note "sanitizer: compute-sanitizer not found"
  else
    # API errors are not memory errors, and the tests provoke out-of-memory on purpose.
    SAN_ARGS=(--tool memcheck --error-exitcode 1 --report-api-errors no --print-limit 50)
    percent="${RRMM_STRESS_PERCENT:-25}"
    if [ -n "${SANITIZER_PYTEST:-}" ]; then read -r -a pyt <<< "$SANITIZER_PYTEST"
    else pyt=(test_gpu_stress.py test_device_buffer.py -k "not torch"); fi
    total=0; runs=""
    # errors LOG: the error count compute-sanitizer printed last in LOG ("?" when it printed none).
    errors() { grep -oE "ERROR SUMMARY: [0-9]+" "$1" | tail -1 | grep -oE "[0-9]+" || echo "?"; }
    for t in .gpu/rust/gpu_* .gpu/rust/conformance; do
      [ -x "$t" ] || continue
      name="$(basename "$t")"; log="$OUT/sanitizer_$name.log"
      RRMM_STRESS_PERCENT="$percent" "$SAN" "${SAN_ARGS[@]}" "$t" --ignored --test-threads=1 > "$log" 2>&1
      rc=$?; n="$(errors "$log")"
      echo "$name: $n memcheck errors (exit $rc), $(grep 'test result' "$log" | tail -1)"
      runs="$runs $name=$n"; [ "$n" = "?" ] && n=1; total=$((total + n))
    done
    log="$OUT/sanitizer_pytest.log"
    (cd tests/python && RRMM_STRESS_PERCENT="$percent" "$SAN" "${SAN_ARGS[@]}" python3 -m pytest \
      -q -rs -p no:cacheprovider --timeout=900 "${pyt[@]}") > "$log" 2>&1
    rc=$?; n="$(errors "$log")"
    echo "pytest: $n memcheck errors (exit $rc), $(grep -E 'passed|failed' "$log" | tail -1)"
    runs="$runs pytest=$n"; [ "$n" = "?" ] && n=1; total=$((total + n))
    note "sanitizer memcheck: $total errors in all ($runs )"
    grep -h -m 20 -E "^========= (Invalid|Program hit|Error|  *at )" "$OUT"/sanitizer_*.log | head -40
  fi
fi

if has python; then
  echo "== pytest (GPU)"
  (cd tests/python && PYTHONPATH="$(alias_site)" python3 -m pytest -q -rs -p no:cacheprovider --timeout=300 ${PYTEST_ARGS:-} 2>&1) | tee "$OUT/pytest.log" | tail -40
  note "pytest: $(tail -1 "$OUT/pytest.log")"
fi

if has w1; then
  echo "== W1: trace replay, rrmm (Rust engine via the CLI) and RMM (C++)"
  LIBRMM="$SITE/librmm"; LOGGER="$SITE/rapids_logger"
  if nvcc -std=c++20 -O2 -o /tmp/rmm_replay benches/gpu/rmm_replay.cu -I"$LIBRMM/include" \
      -I"$LIBRMM/include/rapids" -I"$LOGGER/include" -L"$LIBRMM/lib64" -lrmm \
      -L"$LOGGER/lib64" -lrapids_logger -Xlinker -rpath="$LIBRMM/lib64:$LOGGER/lib64" \
      > "$OUT/nvcc.log" 2>&1; then
    for t in random_10k_1mib random_100k_4mib transformer_training; do
      python3 benches/gpu/compile_trace.py "python/rrmm/traces/$t.csv.gz" "/tmp/$t.txt"
      res="pool,binning,arena,cuda_async"; [ "$t" != random_100k_4mib ] && res="$res,cuda"
      timeout 300 /tmp/rmm_replay "$t" "/tmp/$t.txt" "$res" 3 | tee -a "$OUT/w1_rmm.jsonl"
    done
  else
    echo "nvcc build of the RMM replay failed:"; tail -30 "$OUT/nvcc.log"
  fi
  if [ -f benches/gpu/w1_rrmm.py ]; then python3 benches/gpu/w1_rrmm.py --traces python/rrmm/traces --out "$OUT/w1_rrmm.jsonl"; fi
  [ -f benches/gpu/summarize.py ] && python3 benches/gpu/summarize.py w1 "$OUT" | tee -a "$SUMMARY"
fi

if has w3; then
  for t in random_10k_1mib transformer_training; do
    [ -f "/tmp/$t.txt" ] || python3 benches/gpu/compile_trace.py "python/rrmm/traces/$t.csv.gz" "/tmp/$t.txt"
  done
fi
for w in w2 w3; do
  if has $w && [ -f benches/gpu/$w.py ]; then
    echo "== ${w^^}"
    extra=(); [ "$w" = w2 ] && [ -n "${W2_RESOURCES:-}" ] && extra=(--resources "$W2_RESOURCES")
    (cd benches/gpu && python3 $w.py --out "$OUT/$w.json" "${extra[@]}") 2>&1 | tee "$OUT/$w.log" | tail -30
    [ -f benches/gpu/summarize.py ] && python3 benches/gpu/summarize.py $w "$OUT" | tee -a "$SUMMARY"
  fi
done

if has w2base; then
  # W2 pool before/after: the wheel of an earlier commit (.gpu/wheels-base, see docs/gpu.md)
  # against this one, alternating processes; RMM runs in both as a control.
  if ls .gpu/wheels-base/*.whl >/dev/null 2>&1; then
    echo "== W2 pool, before/after"
    python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/site-base .gpu/wheels-base/*.whl
    for i in $(seq 1 "${W2BASE_ROUNDS:-3}"); do
      (cd benches/gpu && PYTHONPATH=/tmp/site-base:$SITE python3 w2.py --resources pool --reps 3 --out "$OUT/w2_before_$i.json" > /dev/null)
      (cd benches/gpu && python3 w2.py --resources pool --reps 3 --out "$OUT/w2_after_$i.json" > /dev/null)
    done
    python3 benches/gpu/summarize.py w2base "$OUT" | tee -a "$SUMMARY"
  else
    note "w2base: no .gpu/wheels-base wheel"
  fi
fi

if has w7; then
  echo "== W7: threads on their own streams, and 4 streams x 4 spinning kernels; RMM (C++) and rrmm"
  LIBRMM="$SITE/librmm"; LOGGER="$SITE/rapids_logger"
  w7_nvcc() {
    nvcc -std=c++20 -O3 -arch=native "$@" -I"$LIBRMM/include" -I"$LIBRMM/include/rapids" \
      -I"$LOGGER/include" benches/gpu/rmm_w7.cu -L"$LIBRMM/lib64" -L"$LOGGER/lib64" -lrmm \
      -lrapids_logger -Xlinker -rpath="$LIBRMM/lib64:$LOGGER/lib64" -o /tmp/rmm_w7
  }
  : > "$OUT/w7_rmm.jsonl"; : > "$OUT/w7_rrmm.jsonl"
  # RMM's side with arena and binning; without them (the original three) if that does not build.
  if w7_nvcc > "$OUT/nvcc_w7.log" 2>&1 || w7_nvcc -DRMM_W7_NO_EXTRA >> "$OUT/nvcc_w7.log" 2>&1; then
    timeout 1200 /tmp/rmm_w7 | tee "$OUT/w7_rmm.jsonl"
  else
    echo "nvcc build of RMM's W7 failed:"; tail -30 "$OUT/nvcc_w7.log"
  fi
  if [ -x .gpu/bench/w7 ]; then
    timeout 1200 .gpu/bench/w7 | tee "$OUT/w7_rrmm.jsonl"
  else
    echo "no .gpu/bench/w7: build it with scripts/gpu_prepare.sh bench"
  fi
  python3 benches/gpu/w7_summary.py "$OUT" | tee -a "$SUMMARY"
fi

if has hooks && [ -f benches/python/bench_hooks.py ]; then
  echo "== W4-W6: framework hooks"
  python3 benches/python/bench_hooks.py --json "$OUT/hooks.json" ${HOOKS_ARGS:-} 2>&1 | tee "$OUT/hooks.log" | tail -30
  sed -n '/^\[/,$p' "$OUT/hooks.log" >> "$SUMMARY"
fi

if has profile; then
  echo "== W6 profile: where device_array's time goes"
  python3 benches/python/profile_numba.py --json "$OUT/profile_numba.json" 2>&1 | tee "$OUT/profile_numba.log" | tail -12
  cat "$OUT/profile_numba.log" >> "$SUMMARY"
fi

# cuda_async from Python (issue 21's W2 row): DeviceBuffer and resource round trips, rrmm beside
# RMM in one process, alternating, and on a fresh thread; a perf profile of rrmm's loop when perf
# is there.
if has asyncsplit; then
  echo "== cuda_async round trip from Python, split"
  python3 benches/gpu/cuda_async_split.py --out "$OUT/asyncsplit.jsonl" 2>&1 | tee "$OUT/asyncsplit.txt"
  note "$(cat "$OUT/asyncsplit.txt")"
  if command -v perf > /dev/null; then
    perf record -F 4000 -g -o /tmp/asyncsplit.perf -- python3 -c '
import rrmm
rrmm.mr.set_current_device_resource(rrmm.mr.CudaAsyncMemoryResource())
for _ in range(300000):
    rrmm.DeviceBuffer(size=1 << 20)' > /dev/null 2>&1
    perf report -i /tmp/asyncsplit.perf --stdio --no-children --sort dso,symbol 2>/dev/null \
      | grep -v "^$" | head -120 > "$OUT/asyncsplit_perf.txt"
    note "perf (rrmm DeviceBuffer loop, self time by dso/symbol):"
    note "$(grep -E '^ +[0-9]' "$OUT/asyncsplit_perf.txt" | head -25)"
  else
    note "perf: not on this machine"
  fi
fi

if has cupythreads; then
  # The CuPy hook from 8 threads on their own non-blocking streams, per resource and variant,
  # each in its own process (a crash ends one case). With gdb, a crashing case is rerun under
  # it for a backtrace (RRMM_DEBUG_SO: an unstripped extension to put in place first).
  echo "== CuPy hook from threads on their streams"
  [ -n "${RRMM_DEBUG_SO:-}" ] && [ -f "$RRMM_DEBUG_SO" ] && cp "$RRMM_DEBUG_SO" "$SITE/rrmm/_rrmm.abi3.so"
  for res in ${CUPY_THREADS_RESOURCES:-cuda pool arena binning cuda_async}; do
    for variant in late early keep; do
      timeout 120 python3 benches/gpu/cupy_threads.py "$res" "$variant" > "$OUT/cupy_threads_${res}_$variant.log" 2>&1
      rc=$?
      note "cupy threads $res $variant: rc=$rc $(grep -E '^OK|Error|Fatal' "$OUT/cupy_threads_${res}_$variant.log" | head -1 | cut -c1-120)"
      if [ $rc -ne 0 ] && command -v gdb > /dev/null && [ ! -f "$OUT/gdb_$res.log" ]; then
        timeout 180 gdb -q -batch -ex run -ex "thread apply all bt 25" --args python3 benches/gpu/cupy_threads.py "$res" "$variant" > "$OUT/gdb_$res.log" 2>&1
      fi
    done
  done
fi

if has asyncw1; then
  # cuda_async in W1, warm against warm, each side in its own process (RMM's C++ harness, rrmm's
  # replay engine natively in benches/cuda_async_overhead.rs and through Python's replay_logs as
  # `rrmm replay` runs it), alternating, 5 rounds; the bench also times a bare loop over rrmm's
  # resource and over the driver's pool calls (rrmm's own share).
  echo "== cuda_async W1, alternating"
  if [ ! -x /tmp/rmm_replay ]; then
    LIBRMM="$SITE/librmm"; LOGGER="$SITE/rapids_logger"
    nvcc -std=c++20 -O2 -o /tmp/rmm_replay benches/gpu/rmm_replay.cu -I"$LIBRMM/include" \
      -I"$LIBRMM/include/rapids" -I"$LOGGER/include" -L"$LIBRMM/lib64" -lrmm \
      -L"$LOGGER/lib64" -lrapids_logger -Xlinker -rpath="$LIBRMM/lib64:$LOGGER/lib64" > "$OUT/nvcc.log" 2>&1
  fi
  for t in random_10k_1mib random_100k_4mib transformer_training; do
    [ -f "/tmp/$t.txt" ] || python3 benches/gpu/compile_trace.py "python/rrmm/traces/$t.csv.gz" "/tmp/$t.txt"
  done
  : > "$OUT/asyncw1_rmm.jsonl"; : > "$OUT/asyncw1_split.jsonl"; : > "$OUT/asyncw1_python.jsonl"
  for round in 1 2 3 4 5; do
    for t in random_10k_1mib random_100k_4mib transformer_training; do
      timeout 300 /tmp/rmm_replay "$t" "/tmp/$t.txt" cuda_async 7 >> "$OUT/asyncw1_rmm.jsonl"
      for s in legacy ptds; do
        timeout 300 /tmp/rmm_replay "$t" "/tmp/$t.txt" cuda_async 7 "$s" \
          | sed "s/}\$/, \"stream\": \"$s\"}/" >> "$OUT/asyncw1_rmm.jsonl"
      done
      timeout 300 python3 benches/gpu/w1_rrmm.py --traces python/rrmm/traces --only "$t" \
        --resources cuda_async --reps 7 --out /tmp/asyncw1_py.jsonl > /dev/null \
        && cat /tmp/asyncw1_py.jsonl >> "$OUT/asyncw1_python.jsonl"
    done
    RRMM_TRACES="$PWD/python/rrmm/traces" timeout 300 .gpu/bench/cuda_async_overhead >> "$OUT/asyncw1_split.jsonl"
  done
  python3 benches/gpu/summarize.py asyncw1 "$OUT" | tee -a "$SUMMARY"
fi

# The .pth of RRMM_AS_RMM only works from a site directory; --target dirs are not one, so a
# sitecustomize on PYTHONPATH makes $SITE one in every process (dask workers included).

if has rmmtests; then
  echo "== RMM's Python test suite: on RMM, then on rrmm (RRMM_AS_RMM=1), same run"
  if [ -d .rmm-tests ]; then
    (cd .rmm-tests && python3 -m pytest -q -p no:cacheprovider --timeout=600 . 2>&1) > "$OUT/rmmtests_rmm.log"
    (cd .rmm-tests && RRMM_AS_RMM=1 PYTHONPATH="$(alias_site)" python3 -m pytest -q -p no:cacheprovider -rf --timeout=600 . 2>&1) > "$OUT/rmmtests_rrmm.log"
    note "RMM's tests on RMM:  $(tail -1 "$OUT/rmmtests_rmm.log")"
    note "RMM's tests on rrmm: $(tail -1 "$OUT/rmmtests_rrmm.log")"
    grep -E "^FAILED|^ERROR" "$OUT/rmmtests_rrmm.log" | cut -c1-160 | sort | uniq -c | sort -rn | head -40
  else
    note "rmmtests: .rmm-tests/ missing (scripts/rmm_tests.md)"
  fi
fi

if has dask; then
  echo "== Dask: LocalCUDACluster, two workers, rrmm's pool on both GPUs"
  python3 -m pip install -q --upgrade --no-deps --no-index --no-compile --target "$SITE" .whl-dask/*.whl \
    || echo "dask wheel install failed"
  python3 benches/gpu/dask_stage.py plugin --out "$OUT/dask_plugin.json" 2>&1 | tee "$OUT/dask_plugin.log" | grep -v "^INFO\|distributed\." | tail -20
  RRMM_AS_RMM=1 PYTHONPATH="$(alias_site)" python3 benches/gpu/dask_stage.py alias --out "$OUT/dask_alias.json" 2>&1 | tee "$OUT/dask_alias.log" | grep -v "^INFO\|distributed\." | tail -20
  note "dask (RRMMSetup): $(grep -E '^dask plugin' "$OUT/dask_plugin.log" || echo 'no result')"
  note "dask (RRMM_AS_RMM=1, dask-cuda's options): $(grep -E '^dask alias' "$OUT/dask_alias.log" || echo 'no result')"
fi

# W9 (rapids-singlecell's Harmony) and W8 (a single-cell CuPy pipeline): each setup in its own
# process, rrmm beside RMM and CuPy's own answers (benches/gpu/w8_w9.py; .w9 from gpu_prepare w9).
# W9_SETUPS / W8_SETUPS / W9_ROUNDS override the lists.
W9_DEFAULT="cupy:pool,rrmm:pool,rmm:pool,rrmm:managed,rmm:managed,rrmm:managed_pool,rmm:managed_pool"
W9_DEFAULT="$W9_DEFAULT,rrmm:async_managed,rmm:async_managed,rrmm:prefetch_pool_managed"
W9_DEFAULT="$W9_DEFAULT,rmm:prefetch_pool_managed,rrmm:cuda,rmm:cuda,rrmm:fallback"
W9_DEFAULT="$W9_DEFAULT,rrmm:managed_nocache,rrmm:managed_placement_only,rrmm:managed_cache_only"
W9_DEFAULT="$W9_DEFAULT,cupy:managed_pool,cupy:managed"
if has w9; then
  echo "== W9: Harmony per allocator setup"
  python3 benches/gpu/w8_w9.py --rsc .w9 --rounds "${W9_ROUNDS:-1}" --out "$OUT/w9.jsonl" \
    --all "${W9_SETUPS:-$W9_DEFAULT}" 2>&1 | tee "$OUT/w9.txt" | tail -30
  note "$(grep -A40 '^W9 Harmony' "$OUT/w9.txt")"
fi
if has w8; then
  echo "== W8: single-cell pipeline per allocator setup"
  python3 benches/gpu/w8_w9.py --workload pipeline --cells 100000 --rsc .w9 --rounds "${W8_ROUNDS:-1}" \
    --out "$OUT/w8.jsonl" --all "${W8_SETUPS:-$W9_DEFAULT}" 2>&1 | tee "$OUT/w8.txt" | tail -30
  note "$(grep -A40 '^W8 pipeline' "$OUT/w8.txt")"
fi

# W10: pinned host memory per library (benches/gpu/w10_pinned.py), each in its own process.
if has w10; then
  echo "== W10: pinned host memory"
  python3 benches/gpu/w10_pinned.py --pool-gib "${W10_POOL_GIB:-16}" --out "$OUT/w10.jsonl" \
    2>&1 | tee "$OUT/w10.txt" | tail -30
  note "$(grep -A30 '^W10 pinned' "$OUT/w10.txt")"
fi

# Issue 32: an expandable pool sleeps and wakes (benches/gpu/sleep_wake.py: a = CuPy arrays, GB/s
# against the link; b = another process uses the memory meanwhile, a refused wake loses nothing;
# c = PyTorch tensors and a CUDA graph after the wake; d = issue 37: a fresh process with the
# defaults, pages made ready ahead, sleeps at the link). SLEEP_GIB (default 40), SLEEP_PARTS
# (default "a b c d"), one process each.
if has sleep; then
  echo "== sleep and wake"
  for part in ${SLEEP_PARTS:-a b c d}; do
    timeout 600 python3 benches/gpu/sleep_wake.py --part "$part" --gib "${SLEEP_GIB:-40}" \
      2> "$OUT/sleep_$part.err" | tee -a "$OUT/sleep.jsonl"
    tail -3 "$OUT/sleep_$part.err"
  done
  note "sleep: $(wc -l < "$OUT/sleep.jsonl") parts reported"
fi

# Issue 37: the engines' documented sleep flows through rrmm.compat (torch_memory_saver's README
# examples with PyTorch tensors and a CUDA graph; vLLM's CuMemAllocator flow).
if has engines; then
  echo "== engines' sleep APIs"
  timeout 300 python3 benches/gpu/engine_compat.py --gib "${ENGINES_GIB:-4}" \
    2> "$OUT/engines.err" > "$OUT/engines.json"
  tail -5 "$OUT/engines.err"
  note "engines: $(cat "$OUT/engines.json")"
fi

# Issue 47: torch_memory_saver 0.0.10's own examples under rrmm's import alias (its test
# directory in .whl-tms/test, a checkout's), then pause and resume beside torch_memory_saver
# itself (its wheel in .whl-tms, installed apart so the alias run never sees it): TMS_GIB sizes
# (default "8"), TMS_BACKENDS (default pinned,mmap,disk), TMS_CYCLES (default 2); each row's
# GB/s and share of the link, residual device memory while paused, host memory after resume.
# TMS_SELF=1 also runs its test_examples.py against torch_memory_saver itself.
if has tms; then
  TMS_SITE=/tmp/tms-site
  python3 -m pip install -q --upgrade --no-deps --no-index --no-compile --target "$TMS_SITE" \
    .whl-tms/*.whl || note "tms: torch_memory_saver's wheel did not install"
  if [ "${TMS_EXAMPLES:-1}" = 1 ]; then
    echo "== torch_memory_saver's examples under rrmm's alias"
    (cd tests/python && PYTHONPATH="$(alias_site)" RRMM_TMS_TESTS="$PWD/../../.whl-tms/test" \
      python3 -m pytest -q -rsxX -p no:cacheprovider --timeout=300 test_gpu_tms_examples.py 2>&1) \
      | tee "$OUT/tms_examples.log" | tail -40
    note "tms examples under rrmm: $(tail -1 "$OUT/tms_examples.log")"
  fi
  if [ "${TMS_SELF:-0}" = 1 ]; then
    echo "== torch_memory_saver's test_examples.py against torch_memory_saver 0.0.10"
    (cd .whl-tms/test && PYTHONPATH="$TMS_SITE:$PYTHONPATH" timeout 400 python3 -m pytest -q -rs \
      -p no:cacheprovider test_examples.py 2>&1) | tee "$OUT/tms_self.log" | tail -15
    note "tms examples under torch_memory_saver: $(tail -1 "$OUT/tms_self.log")"
  fi
  for g in ${TMS_GIB:-8}; do
    echo "== pause/resume beside torch_memory_saver, $g GiB"
    PYTHONPATH="$TMS_SITE:$PYTHONPATH" timeout 580 python3 benches/gpu/tms_compare.py --gib "$g" \
      --cycles "${TMS_CYCLES:-2}" --backends "${TMS_BACKENDS:-pinned,mmap,disk}" --disk-dir /tmp \
      2> "$OUT/tms_compare_$g.err" | tee -a "$OUT/tms_compare.jsonl" | cut -c1-300
    tail -3 "$OUT/tms_compare_$g.err"
  done
  python3 - "$OUT/tms_compare.jsonl" <<'PY' | tee -a "$SUMMARY"
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "lib" not in r:
        print("tms disk:", {k: round(v, 2) for k, v in r.items() if isinstance(v, float)})
        continue
    if "error" in r:
        print("tms", r["lib"], r["backend"], r["retain"], "error:", r["error"][-200:].replace("\n", " "))
        continue
    f = lambda xs: "/".join(f"{x:.1f}" for x in xs)
    p = lambda xs: "/".join(f"{100 * x:.0f}%" for x in xs)
    print(f"tms {r['lib']:18s} {r['gib']:3d} GiB {r['backend']:6s} retain={str(r['retain']):5s} "
          f"pause {f(r['pause_gbps'])} GB/s ({p(r['pause_share'])}) resume {f(r['resume_gbps'])} "
          f"({p(r['resume_share'])}) kept={r['bytes_kept']} residual paused "
          f"{f([b / 2**20 for b in r['residual_while_paused_bytes']])} MiB (context "
          f"{r['context_used_bytes'] / 2**20:.0f} MiB) rss after resume "
          f"{f([b / 2**30 for b in r['rss_after_resume_bytes']])} GiB")
PY
fi

# Issue 47: vLLM's backend driven as vLLM drives it (tests/python/test_gpu_vllm_sleep_mode.py).
if has vllm; then
  echo "== vLLM's sleep-mode backend rrmm"
  (cd tests/python && PYTHONPATH="$(alias_site)" python3 -m pytest -q -rs -p no:cacheprovider \
    --timeout=500 test_gpu_vllm_sleep_mode.py 2>&1) | tee "$OUT/vllm.log" | tail -20
  note "vllm backend: $(tail -1 "$OUT/vllm.log")"
fi

# Issue 47: a first sleep with nothing made ahead (its pages made while it copies) against the
# host's page-making rates measured in the same process (benches/gpu/sleep_wake.py part d).
if has firstsleep; then
  echo "== first sleep, nothing made ahead"
  timeout 500 python3 benches/gpu/sleep_wake.py --part d --no-prepare --gib "${SLEEP_GIB:-40}" \
    --sleeps 2 2> "$OUT/firstsleep.err" > "$OUT/firstsleep.json"
  tail -3 "$OUT/firstsleep.err"
  python3 - "$OUT/firstsleep.json" <<'PY' | tee -a "$SUMMARY"
import json, sys
d = json.load(open(sys.argv[1]))
print("first sleep, nothing ahead:", d["gib"], "GiB; host pages", d["host_page_rates"], "; link",
      {k: round(v, 1) for k, v in d["link"].items()})
for s in d["sleeps"]:
    print(f"  sleep {s['sleep']}: out {s['offload_gbps']:.1f} GB/s ({100 * s['offload_vs_link']:.0f}%),"
          f" back {s['restore_gbps']:.1f} ({100 * s['restore_vs_link']:.0f}%), host_reused "
          f"{s['host_reused']}, ok {s['data_and_addresses_ok']}")
PY
fi

# Issue 37's soak (benches/gpu/sleep_wake.py part e): SOAK_CYCLES sleeps of SOAK_GIB GiB (default
# 1000 of 40) within SOAK_BUDGET_S seconds (default 240; a longer soak runs in batches of calls),
# every cycle's data and CUDA-graph output checked, device and host memory recorded.
if has soak; then
  echo "== soak"
  timeout 600 python3 benches/gpu/sleep_wake.py --part e --gib "${SOAK_GIB:-40}" \
    --cycles "${SOAK_CYCLES:-1000}" --budget-s "${SOAK_BUDGET_S:-240}" \
    2> "$OUT/soak.err" > "$OUT/soak.json"
  tail -3 "$OUT/soak.err"
  note "soak: $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d.pop("cycles"); print(json.dumps(d))' "$OUT/soak.json")"
fi

# The cost of rrmm.record_memory_history on W4/W5, and a CuPy workload's snapshot with its
# history read by torch.cuda._memory_viz (benches/gpu/history_cost.py).
if has history; then
  echo "== history: record_memory_history on W4/W5, memory_viz on a CuPy snapshot"
  python3 benches/gpu/history_cost.py --snapshot "$OUT/cupy_history.pickle" 2>&1 \
    | tee "$OUT/history.txt" | tail -20
  note "$(cat "$OUT/history.txt")"
fi

# W15 / issue 38: one GPU, three processes with phases (benches/gpu/shared_gpu.py): rrmm's ledger
# beside RMM's pools (.whl), static thirds and the sequential schedule; then the rrmm mode with A
# killed mid-phase (SHARED_KILL_AT, default A:burst:1); then two Dask workers whose tasks
# alternate, with and without the ledger (benches/gpu/shared_gpu_dask.py; .whl-dask as in the
# dask stage). SHARED_ARGS adds options to both shared_gpu.py runs (e.g. "--reps 3").
if has shared; then
  echo "== W15: one GPU, many processes"
  timeout 1500 python3 benches/gpu/shared_gpu.py --mode all --out "$OUT/shared_gpu.json" \
    ${SHARED_ARGS:-} 2> "$OUT/shared_gpu.err" | tee "$OUT/shared_gpu.txt"
  tail -5 "$OUT/shared_gpu.err"
  note "$(grep '^W15' "$OUT/shared_gpu.txt" | grep -v '^W15 plan' || echo 'W15: no result')"
  echo "== W15: the same, rrmm, one process killed mid-phase"
  timeout 600 python3 benches/gpu/shared_gpu.py --mode rrmm --kill A \
    ${SHARED_KILL_AT:+--kill-at "$SHARED_KILL_AT"} --out "$OUT/shared_gpu_kill.json" \
    ${SHARED_ARGS:-} 2> "$OUT/shared_gpu_kill.err" | tee "$OUT/shared_gpu_kill.txt"
  tail -5 "$OUT/shared_gpu_kill.err"
  note "kill run: $(grep -E '^W15 (rrmm|shared)' "$OUT/shared_gpu_kill.txt" || echo 'no result')"
  if ls .whl-dask/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --upgrade --no-deps --no-index --no-compile --target "$SITE" .whl-dask/*.whl \
      || echo "dask wheel install failed"
  fi
  if python3 -c "import distributed" > /dev/null 2>&1; then
    echo "== W15 with Dask: two workers on one GPU"
    timeout 1300 python3 benches/gpu/shared_gpu_dask.py --mode both --out "$OUT/shared_gpu_dask.json" \
      2>&1 | tee "$OUT/shared_gpu_dask.log" | grep -v "^INFO\|distributed\." | tail -20
    note "$(grep '^W15 dask' "$OUT/shared_gpu_dask.log" || echo 'W15 dask: no result')"
  else
    note "W15 dask: distributed is not installed (.whl-dask/ has no wheels)"
  fi
fi

echo
echo "================ SUMMARY ================"
cat "$SUMMARY"
