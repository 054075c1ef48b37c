"""W15: one GPU, many processes with phases (issue 38), through rrmm's ledger and without it.

    python benches/gpu/shared_gpu.py --plan                      # the schedule, no GPU needed
    python benches/gpu/shared_gpu.py [--mode all] [--out w15.json]
    python benches/gpu/shared_gpu.py --mode rrmm --kill A [--kill-at A:burst:1] --out kill.json
    python benches/gpu/shared_gpu.py --dry-run-gib 0.25 --scale 0.1   # protocol check on a CPU

Three worker processes (this file with ``--role``, each a fresh CUDA process) share one GPU of
D bytes (``memGetInfo``'s total); every size is a fraction of D (``--plan`` prints them):

- A, a CuPy pipeline: keeps a state (0.30 D, 512 MiB arrays of known integers) and bursts to
  0.50 D (a 0.20 D array, computed on in place while the state is read, then freed) three times;
  then it is idle until C has finished (rrmm: ``declare_idle``), wakes (``declare_busy``), checks
  its state and bursts twice more.
- B, a PyTorch loop: 0.25 D steady (tensors it reads each step, a matmul per step), spiking to
  0.35 D ten times; never idle.
- C: holds 0.02 D and is idle until A is; then bursts to 0.52 D (a 0.50 D array) once, and ends.

The peaks sum to 1.37 D; the memory the work in progress needs (the busy processes' bytes) stays
at or below 0.87 D at every instant. During C's burst the bytes held, A's idle state counted, are
1.17 D: C's burst fits only if idle A's state leaves the device (rrmm: the ledger trims A's and
B's cached memory, then puts A's pool to sleep: A's state is above its soft share, ``A=25%``).

Modes, each in fresh processes, started one after another (A, then B, then C: RMM's default
initial pool depends on the order), warmed up (kernels compiled) before the clock starts:

- ``rrmm``: ``rrmm.reinitialize(pool_allocator="expandable", share_gpu={"name": role, ...})``
  and rrmm's CuPy/PyTorch hooks; A and C declare their idle points; a fresh ledger directory
  (``RRMM_LEDGER_DIR``) per run; A makes its sleep's host pages ready at start-up
  (``prepare_sleep``, off the clock; ``--no-prepare-sleep``: the first sleep makes them).
- ``rmm``: ``rmm.reinitialize(pool_allocator=True)`` (RMM's pool: initial half the free memory)
  and RMM's hooks (the reference; needs RMM's wheels, without ``RRMM_AS_RMM``).
- ``static``: rrmm pools capped at a third of the device each
  (``reinitialize(pool_allocator=True, maximum_pool_size=D // 3)``); RMM with the same
  ``maximum_pool_size`` is the same split.
- ``sequential``: A, then B, then C alone, each on rrmm's expandable pool without a ledger: the
  reference wall time (the sum of their times from start to done).

Each worker counts out-of-memory errors (MemoryError, CuPy's and PyTorch's OutOfMemoryError): a
step that runs out is retried after ``--retry-wait`` s up to ``--retries`` times, then skipped, so
every mode finishes. Every persistent array's checksum (exact integer sums) is checked before
A idles, after every wake and at the end. ``--kill ROLE`` SIGKILLs that process (by its pid) when
``--kill-at`` happens (``ROLE:EVENT[:N]``, events: ``A:burst:N`` A's N-th burst (0-based; the
first three come before its idle time), ``C:burst`` C's burst (A asleep in the rrmm mode),
``B:spike:N``) plus ``--kill-delay`` s; the others must still finish without running out.

Output: a summary table (lines starting ``W15``) and, with ``--out``, one JSON file: the plan,
per run each role's result (OOMs, skipped steps, checksum checks, allocation and wake times,
the ledger's history in the rrmm mode), the orchestrator's timeline, the device's peak memory
use (``nvidia-smi``, sampled every 100 ms) and the summary rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import gc
import importlib
import importlib.util
import json
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

GIB = 1 << 30
MIB = 1 << 20
ROLES = ("A", "B", "C")
SHARED_MODES = ("rrmm", "rmm", "static")
MODES = ("sequential", *SHARED_MODES)
PREFIX = "@@ "
DEFAULT_KILL_AT = {"A": "A:burst:1", "B": "B:spike:1", "C": "C:burst"}
STATIC_NOTE = "each pool capped at D/3 (RMM with maximum_pool_size=D/3 is the same split)"


# ------------------------------------------------------------------------------------ the plan


@dataclass(frozen=True)
class Plan:
    """The schedule: sizes as fractions of the device, work as counts."""

    a_state: float = 0.30
    a_burst: float = 0.20
    a_bursts_before: int = 3
    a_bursts_after: int = 2
    a_passes: int = 30
    b_steady: float = 0.25
    b_spike: float = 0.10
    b_steps: int = 600
    b_spikes: int = 10
    b_matmul: int = 4096
    c_hold: float = 0.02
    c_burst: float = 0.50
    c_passes: int = 20
    # Per process beyond its arrays: CUDA context, modules, cuBLAS workspace (an estimate).
    context: float = 0.015
    chunk_mib: int = 512

    def scaled(self, scale: float) -> Plan:
        """The same sizes with the work (passes, steps) scaled."""

        def s(n: int) -> int:
            return max(1, round(n * scale))

        return dataclasses.replace(self, a_passes=s(self.a_passes), b_steps=max(
            self.b_spikes, s(self.b_steps)), c_passes=s(self.c_passes))

    def peaks(self) -> dict[str, float]:
        return {"A": self.a_state + self.a_burst, "B": self.b_steady + self.b_spike,
                "C": self.c_hold + self.c_burst}

    def phases(self) -> list[dict[str, Any]]:
        """The shared schedule's phases: each role busy (its peak there), idle (what it holds)
        or gone; B at its spike throughout (the worst case)."""
        p = self.peaks()
        rows = [
            (f"1 A bursts x{self.a_bursts_before}, C idle",
             {"A": ("busy", p["A"]), "B": ("busy", p["B"]), "C": ("idle", self.c_hold)}),
            ("2 A idle, C bursts",
             {"A": ("idle", self.a_state), "B": ("busy", p["B"]), "C": ("busy", p["C"])}),
            (f"3 A wakes, bursts x{self.a_bursts_after}; C ended",
             {"A": ("busy", p["A"]), "B": ("busy", p["B"]), "C": ("gone", 0.0)}),
        ]
        out = []
        for name, roles in rows:
            live = sum(f for state, f in roles.values() if state == "busy")
            held = sum(f for _state, f in roles.values())
            out.append({"phase": name, "roles": {r: {"state": s, "fraction": round(f, 4)}
                                                 for r, (s, f) in roles.items()},
                        "live": round(live, 4), "held": round(held, 4)})
        return out

    def checks(self) -> dict[str, Any]:
        phases = self.phases()
        peaks = sum(self.peaks().values())
        live = max(ph["live"] for ph in phases)
        held = max(ph["held"] for ph in phases)
        with_contexts = live + len(ROLES) * self.context
        return {
            "sum_of_peaks": round(peaks, 4),
            "max_live": round(live, 4),
            "max_live_with_contexts": round(with_contexts, 4),
            "max_held": round(held, 4),
            "peaks_above_device": peaks > 1.0,
            "live_below_device": with_contexts < 1.0,
            "held_above_device": held > 1.0,
        }


def print_plan(plan: Plan, gib: float, soft_shares: dict[str, str]) -> bool:
    checks = plan.checks()
    print(f"W15 plan: fractions of the device D (GiB at D = {gib:g} GiB); live = the busy "
          "processes' bytes, held = with idle ones' data")
    print(f"  {'phase':34} {'A':>14} {'B':>14} {'C':>14} {'live':>6} {'held':>6}")
    for ph in plan.phases():
        cells = []
        for r in ROLES:
            c = ph["roles"][r]
            cells.append("-" if c["state"] == "gone" else f"{c['fraction']:.2f} {c['state']}")
        print(f"  {ph['phase']:34} {cells[0]:>14} {cells[1]:>14} {cells[2]:>14} "
              f"{ph['live']:6.2f} {ph['held']:6.2f}")
    peaks = plan.peaks()
    print("  peaks: " + " + ".join(f"{r} {peaks[r]:.2f}" for r in ROLES)
          + f" = {checks['sum_of_peaks']:.2f} D ({checks['sum_of_peaks'] * gib:.1f} GiB): "
          + ("above the device" if checks["peaks_above_device"] else "NOT above the device"))
    print(f"  live sum at most {checks['max_live']:.2f} D, {checks['max_live_with_contexts']:.3f} D "
          f"with {len(ROLES)} x {plan.context} D of contexts (est.): "
          + ("below the device" if checks["live_below_device"] else "NOT below the device"))
    print(f"  held sum at most {checks['max_held']:.2f} D: "
          + ("C's burst needs idle A's state off the device (rrmm: A sleeps, its state "
             f"{plan.a_state:.2f} D being above its soft share {soft_shares.get('A', 'D/3')})"
             if checks["held_above_device"] else "fits without a sleep"))
    print(f"  sequential: A alone ({peaks['A']:.2f}), then B ({peaks['B']:.2f}), then C "
          f"({peaks['C']:.2f})")
    over = [f"{r} ({peaks[r]:.2f})" for r in ROLES if peaks[r] > 1 / 3]
    print("  static: D/3 each: " + (", ".join(over) + " peak above it" if over else "all fit"))
    print(f"  work: A {plan.a_bursts_before}+{plan.a_bursts_after} bursts x {plan.a_passes} "
          f"passes; B {plan.b_steps} steps ({plan.b_matmul}^2 matmul), {plan.b_spikes} spikes; "
          f"C 1 burst x {plan.c_passes} passes")
    return bool(checks["peaks_above_device"] and checks["live_below_device"])


# ---------------------------------------------------------------------- array operations


def is_oom(error: BaseException) -> bool:
    """Out of memory, whichever library said it."""
    if isinstance(error, MemoryError) or "OutOfMemory" in type(error).__name__:
        return True
    text = str(error).lower()
    return any(s in text for s in ("out of memory", "out_of_memory", "memoryallocation",
                                   "bad_alloc"))


class Ops:
    """What a role does to arrays; one implementation per library. Arrays hold integers below
    1000 as float32, so float64 sums are exact in any order (checksums compare exactly)."""

    name = "?"
    piece = 32 * MIB  # elements per reduction (bounds a float64 temporary to 256 MiB)

    def empty(self, n: int) -> Any:
        raise NotImplementedError

    def fill(self, x: Any, seed: int) -> None:
        raise NotImplementedError

    def sum64(self, x: Any) -> float:
        raise NotImplementedError

    def sync(self) -> None:
        pass

    def filled(self, n: int, seed: int) -> tuple[Any, float]:
        """A new array of ``n`` float32 (known integers) and the seconds its allocation took."""
        t = time.perf_counter()
        x = self.empty(n)
        took = time.perf_counter() - t
        self.fill(x, seed)
        return x, took

    def checksum(self, x: Any) -> list[float]:
        """Exact: the sum of all elements and of every third one, in pieces."""
        n = int(x.shape[0])
        whole = sum(self.sum64(x[i:i + self.piece]) for i in range(0, n, self.piece))
        third = x[1::3]
        m = int(third.shape[0])
        return [whole, sum(self.sum64(third[i:i + self.piece]) for i in range(0, m, self.piece))]

    def passes(self, x: Any, n: int, reads: list[Any]) -> float:
        """``n`` in-place passes over ``x``, each also reducing one of ``reads``; synced."""
        acc = 0.0
        partial = None
        for k in range(n):
            x *= 0.5
            x += 1.0
            if reads:
                s = reads[k % len(reads)].sum()
                partial = s if partial is None else partial + s
        acc += float(x[:1024].sum()) + (float(partial) if partial is not None else 0.0)
        self.sync()
        return acc


class CupyOps(Ops):
    name = "cupy"

    def __init__(self) -> None:
        import cupy

        self.cp = cupy
        self.kernel = cupy.ElementwiseKernel(
            "uint64 seed", "float32 y",
            "y = (float)(((unsigned long long)i * 2654435761ULL + seed) % 1000ULL);",
            "w15_fill")

    def empty(self, n: int) -> Any:
        return self.cp.empty(n, dtype=self.cp.float32)

    def fill(self, x: Any, seed: int) -> None:
        self.kernel(seed, x)

    def sum64(self, x: Any) -> float:
        return float(x.sum(dtype=self.cp.float64))

    def sync(self) -> None:
        self.cp.cuda.runtime.deviceSynchronize()


class TorchOps(Ops):
    name = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def empty(self, n: int) -> Any:
        return self.torch.empty(n, dtype=self.torch.float32, device="cuda")

    def fill(self, x: Any, seed: int) -> None:
        g = self.torch.Generator(device="cuda")
        g.manual_seed(seed)
        x.random_(0, 1000, generator=g)

    def sum64(self, x: Any) -> float:
        return float(self.torch.sum(x, dtype=self.torch.float64))

    def sync(self) -> None:
        self.torch.cuda.synchronize()


class NumpyOps(Ops):
    """``--dry-run-gib``: host arrays, to check the protocol without a GPU."""

    name = "numpy (dry run, no GPU)"

    def __init__(self) -> None:
        import numpy

        self.np = numpy

    def empty(self, n: int) -> Any:
        return self.np.empty(n, dtype=self.np.float32)

    def fill(self, x: Any, seed: int) -> None:
        idx = self.np.arange(x.shape[0], dtype=self.np.uint64)
        x[:] = (idx * self.np.uint64(2654435761) + self.np.uint64(seed)) % self.np.uint64(1000)

    def sum64(self, x: Any) -> float:
        return float(x.sum(dtype=self.np.float64))


# ---------------------------------------------------------------------------- a worker


class Worker:
    """One role in its own process: sets up its memory, follows the orchestrator's commands
    (stdin) and reports events (stdout lines starting with ``@@``)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.role: str = cfg["role"]
        self.mode: str = cfg["mode"]
        self.plan = Plan(**cfg["plan"])
        self.sequential: bool = cfg["sequential"]
        self.dry = cfg.get("dry_run_gib") is not None
        self.shared = self.mode == "rrmm" and not self.dry
        self.retries: int = cfg["retries"]
        self.retry_wait: float = cfg["retry_wait"]
        self.t0 = time.perf_counter()
        self.start_t: float | None = None
        self.ooms: list[dict[str, Any]] = []
        self.skipped: list[str] = []
        self.checks = 0
        self.mismatches: list[dict[str, Any]] = []
        self.alloc_s: dict[str, float] = {}
        self.wakes: list[dict[str, Any]] = []
        self.info: dict[str, Any] = {}
        self.ops: Ops
        self.total = 0
        self.mr: Any = None
        self.acc: Any = None

    # -- protocol
    def emit(self, ev: str, **fields: Any) -> None:
        fields["ev"] = ev
        fields["t"] = round(time.perf_counter() - (self.start_t or self.t0), 4)
        sys.stdout.write(PREFIX + json.dumps(fields) + "\n")
        sys.stdout.flush()

    def told(self, command: str) -> bool:
        """Whether the orchestrator sent ``command`` (never waits)."""
        import select

        while select.select([sys.stdin], [], [], 0)[0]:
            line = sys.stdin.readline()
            if not line or line.strip() == command:
                return True
        return False

    def wait_for(self, command: str) -> None:
        while True:
            line = sys.stdin.readline()
            if not line:
                raise SystemExit(f"{self.role}: the orchestrator is gone (waiting for {command})")
            if line.strip() == command:
                return

    # -- memory set-up per mode
    def setup_memory(self, framework: str) -> None:
        if self.dry:
            self.ops = NumpyOps()
            self.total = int(float(self.cfg["dry_run_gib"]) * GIB)
            self.info["library"] = "numpy"
            return
        lib: Any
        if self.mode == "rmm":
            lib = importlib.import_module("rmm")
            importlib.import_module("rmm.allocators.cupy" if framework == "cupy"
                                    else "rmm.allocators.torch")
            if getattr(lib, "__name__", "") != "rmm":
                raise RuntimeError("`import rmm` gave rrmm (RRMM_AS_RMM?): the rmm mode needs RMM")
            lib.reinitialize(pool_allocator=True)
            self.info["library"] = f"rmm {getattr(lib, '__version__', '?')}"
        else:
            import rrmm

            importlib.import_module(f"rrmm.allocators.{framework}")
            lib = rrmm
            if self.mode == "rrmm":
                share: dict[str, Any] = {"name": self.role}
                soft = self.cfg["soft_shares"].get(self.role)
                if soft is not None:
                    share["soft_share"] = soft
                rrmm.reinitialize(pool_allocator="expandable", share_gpu=share)
            elif self.mode == "sequential":
                rrmm.reinitialize(pool_allocator="expandable")
            elif self.mode == "static":
                _free, total = rrmm.mr.available_device_memory()
                cap = total // 3 // 256 * 256
                rrmm.reinitialize(pool_allocator=True, maximum_pool_size=cap)
                self.info["pool_cap"] = cap
            else:
                raise ValueError(f"unknown mode {self.mode}")
            self.mr = rrmm.mr.get_current_device_resource()
            self.info["library"] = f"rrmm {getattr(rrmm, '__version__', '?')}"
        if framework == "cupy":
            import cupy

            cupy.cuda.set_allocator(lib.allocators.cupy.rmm_cupy_allocator)
            self.ops = CupyOps()
            _free, self.total = cupy.cuda.runtime.memGetInfo()
            name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
            self.info["device"] = name.decode() if isinstance(name, bytes) else str(name)
            self.info["cupy"] = cupy.__version__
        else:
            import torch

            # Before PyTorch's first CUDA allocation (its allocator cannot change after).
            torch.cuda.memory.change_current_allocator(lib.allocators.torch.rmm_torch_allocator)
            self.ops = TorchOps()
            _free, self.total = torch.cuda.mem_get_info()
            self.info["device"] = torch.cuda.get_device_name()
            self.info["torch"] = torch.__version__
            mode = getattr(lib.allocators.torch, "out_of_memory_mode", None)
            if callable(mode):
                self.info["torch_oom_mode"] = mode()

    # -- steps, checks, idle and wake
    def step(self, name: str, fn: Callable[[], None]) -> bool:
        """Runs ``fn``; on out-of-memory records it, waits and retries, then skips it."""
        for attempt in range(self.retries + 1):
            try:
                fn()
                return True
            except Exception as error:  # anything but out-of-memory is raised
                if not is_oom(error):
                    raise
                self.ooms.append({"step": name, "attempt": attempt,
                                  "t": round(time.perf_counter() - (self.start_t or self.t0), 3),
                                  "error": f"{type(error).__name__}: {error}"[:240]})
            gc.collect()
            time.sleep(self.retry_wait)
        self.skipped.append(name)
        return False

    def elements(self, fraction: float) -> int:
        return int(self.total * fraction) // 4

    def chunks(self, fraction: float, seed: int) -> list[Any]:
        """``fraction`` of the device in arrays of at most ``chunk_mib``."""
        n = self.elements(fraction)
        per = self.plan.chunk_mib * MIB // 4
        out: list[Any] = []
        i = 0
        while n > 0:
            k = min(per, n)
            out.append(self.ops.filled(k, seed + i)[0])
            n -= k
            i += 1
        self.ops.sync()
        return out

    def verify(self, label: str, arrays: list[Any], sums: list[list[float]]) -> None:
        for i, (x, want) in enumerate(zip(arrays, sums, strict=True)):
            got = self.ops.checksum(x)
            self.checks += 1
            if got != want:
                self.mismatches.append({"at": label, "array": i, "want": want, "got": got})

    def declare_idle(self) -> None:
        if self.shared:
            import rrmm.shared_gpu

            rrmm.shared_gpu.declare_idle()

    def wake(self, label: str) -> bool:
        """Declares busy (rrmm: what slept wakes); whether the pool is awake."""
        if not self.shared:
            return True
        import rrmm.shared_gpu

        record: dict[str, Any] = {"at": label, "errors": []}
        t = time.perf_counter()
        for _ in range(self.retries + 1):
            try:
                record["woken"] = rrmm.shared_gpu.declare_busy()
                break
            except Exception as error:  # noqa: BLE001 (recorded; it wakes at its next use)
                record["errors"].append(f"{type(error).__name__}: {error}"[:240])
                time.sleep(self.retry_wait)
        record["seconds"] = round(time.perf_counter() - t, 4)
        awake = not bool(getattr(self.mr, "asleep", False))
        if not awake:
            # A pool put to sleep wakes at its next allocation.
            try:
                self.ops.empty(256)
            except Exception as error:  # noqa: BLE001 (recorded)
                record["errors"].append(f"{type(error).__name__}: {error}"[:240])
            awake = not bool(getattr(self.mr, "asleep", False))
        record["awake"] = awake
        self.wakes.append(record)
        return awake

    def warm(self, reads: list[Any]) -> None:
        """Compiles and loads every kernel the timed part runs."""
        x, _ = self.ops.filled(1 << 20, 7)
        self.ops.passes(x, 2, reads[:1])
        self.ops.checksum(x)
        del x
        self.ops.sync()

    # -- the roles
    def run(self) -> None:
        self.setup_memory("torch" if self.role == "B" else "cupy")
        getattr(self, f"role_{self.role.lower()}")()

    def finish(self, arrays: list[Any], sums: list[list[float]], **extra: Any) -> None:
        self.verify("end", arrays, sums)
        work_s = time.perf_counter() - (self.start_t or self.t0)
        result: dict[str, Any] = {
            "role": self.role, "mode": self.mode, "pid": os.getpid(), "device_total": self.total,
            "ops": self.ops.name, "work_s": round(work_s, 4), "ooms": self.ooms,
            "skipped": self.skipped, "checks": self.checks, "mismatches": self.mismatches,
            "alloc_s": self.alloc_s, "wakes": self.wakes, **self.info, **extra,
        }
        if self.shared:
            import rrmm.shared_gpu

            result["history"] = rrmm.shared_gpu.history()
            result["share_status"] = rrmm.shared_gpu.status()
        self.emit("result", **result)

    def ready(self) -> None:
        self.emit("ready", device_total=self.total, setup_s=round(time.perf_counter() - self.t0, 3),
                  **self.info)
        self.wait_for("start")
        self.start_t = time.perf_counter()

    def role_a(self) -> None:
        p = self.plan
        state: list[Any] = []
        if not self.step("setup", lambda: state.extend(self.chunks(p.a_state, 1000))):
            raise RuntimeError("A could not allocate its state")
        sums = [self.ops.checksum(x) for x in state]
        self.warm(state)
        if self.shared and self.cfg.get("prepare_sleep", True):
            t = time.perf_counter()
            self.info["prepare_sleep_bytes"] = int(self.mr.prepare_sleep(wait=True))
            self.info["prepare_sleep_s"] = round(time.perf_counter() - t, 3)
        self.ready()

        def burst(i: int) -> Callable[[], None]:
            def go() -> None:
                x, took = self.ops.filled(self.elements(p.a_burst), 50 + i)
                self.alloc_s[f"burst{i}"] = round(took, 4)
                self.emit("burst", i=i)
                self.ops.passes(x, p.a_passes, state)
                del x
                self.ops.sync()

            return go

        for i in range(p.a_bursts_before):
            self.step(f"burst{i}", burst(i))
        self.verify("before idle", state, sums)
        awake = True
        if not self.sequential:
            self.declare_idle()
            self.emit("idle")
            self.wait_for("wake")
            awake = self.wake("A after C")
        if awake:
            # Every mode reads A's state again here (the sequential schedule too, where nothing
            # slept): the checks are the same work in every mode.
            self.verify("after wake", state, sums)
        for i in range(p.a_bursts_before, p.a_bursts_before + p.a_bursts_after):
            if awake:
                self.step(f"burst{i}", burst(i))
            else:
                self.skipped.append(f"burst{i} (still asleep)")
        if awake:
            self.finish(state, sums)
        else:
            self.finish([], [], note="A's pool did not wake: its state was not read again")

    def role_b(self) -> None:
        p = self.plan
        steady: list[Any] = []
        if not self.step("setup", lambda: steady.extend(self.chunks(p.b_steady, 2000))):
            raise RuntimeError("B could not allocate its steady tensors")
        sums = [self.ops.checksum(x) for x in steady]
        n = p.b_matmul
        a = self.ops.filled(n * n, 3)[0].reshape(n, n) / 1000.0
        b = self.ops.filled(n * n, 4)[0].reshape(n, n) / 1000.0
        every = max(1, p.b_steps // max(1, p.b_spikes))
        spikes = 0

        def work(k: int) -> Callable[[], None]:
            def go() -> None:
                c = a @ b
                s = c[0].sum() + steady[k % len(steady)].sum()
                self.acc = s if self.acc is None else self.acc + s
                if k % 20 == 19:
                    float(self.acc)

            return go

        def spike(i: int) -> Callable[[], None]:
            def go() -> None:
                x, took = self.ops.filled(self.elements(p.b_spike), 70 + i)
                self.alloc_s[f"spike{i}"] = round(took, 4)
                self.emit("spike", i=i)
                self.ops.passes(x, 3, [])
                del x
                self.ops.sync()

            return go

        work(0)()
        self.warm(steady)
        self.acc = None
        self.ops.sync()
        self.ready()
        for k in range(p.b_steps):
            self.step("step", work(k))
            if k % every == every // 2 and spikes < p.b_spikes:
                self.step(f"spike{spikes}", spike(spikes))
                spikes += 1
        if not self.sequential:
            # Beside the others, B holds its steady 25% (a step every 50 ms: serving, not
            # training; the sequential schedule has no such work) until C's burst is over, so
            # that C bursts while B holds its share (the schedule's phase 2).
            k = p.b_steps
            self.emit("steady")
            while not self.told("stop"):
                self.step("step", work(k))
                self.ops.sync()
                time.sleep(0.05)
                k += 1
            self.ops.sync()
            self.finish(steady, sums, steady_steps_beside_c=k - p.b_steps)
            return
        self.ops.sync()
        self.finish(steady, sums)

    def role_c(self) -> None:
        p = self.plan
        hold: list[Any] = []
        if not self.step("setup", lambda: hold.extend(self.chunks(p.c_hold, 3000))):
            raise RuntimeError("C could not allocate what it holds")
        sums = [self.ops.checksum(x) for x in hold]
        self.warm(hold)
        if not self.sequential:
            self.declare_idle()
        self.ready()
        if not self.sequential:
            self.wait_for("go")
            if self.wake("C before its burst"):
                self.verify("after wake", hold, sums)

        def burst() -> None:
            x, took = self.ops.filled(self.elements(p.c_burst), 90)
            self.alloc_s["burst"] = round(took, 4)
            self.emit("burst", i=0)
            self.ops.passes(x, p.c_passes, hold)
            del x
            self.ops.sync()

        self.step("burst", burst)
        self.finish(hold, sums)


def worker_main(config: str) -> int:
    cfg = json.loads(config)
    faulthandler.dump_traceback_later(float(cfg["limit_s"]), exit=True)
    w = Worker(cfg)
    code = 0
    try:
        w.run()
    except SystemExit as e:
        w.emit("error", error=str(e))
        code = 3
    except BaseException as e:  # noqa: BLE001 (reported to the orchestrator)
        w.emit("error", error=f"{type(e).__name__}: {e}"[:500], traceback=traceback.format_exc()[-3000:],
               ooms=w.ooms)
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    # No interpreter teardown: framework objects freed after the memory resource is gone, and
    # seconds of it, are not what is measured; the driver frees everything at exit.
    os._exit(code)


# ------------------------------------------------------------------------ the orchestrator


class Child:
    """A worker process this orchestrator started; ended only by its pid."""

    def __init__(self, role: str, argv: list[str], env: dict[str, str], q: queue.Queue[Any],
                 logdir: str) -> None:
        self.role = role
        self.err_path = os.path.join(logdir, f"{role}.stderr")
        self.err: TextIO = open(self.err_path, "w")  # noqa: SIM115 (closed in close())
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.err, text=True, bufsize=1, env=env)
        self.noise: list[str] = []
        self.ready: dict[str, Any] | None = None
        self.result: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.gone_at: float | None = None
        self.done_at: float | None = None
        self.killed_at: float | None = None
        self.timed_out = False
        self.seen: set[str] = set()
        self.thread = threading.Thread(target=self._read, args=(q,), daemon=True)
        self.thread.start()

    def _read(self, q: queue.Queue[Any]) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            if line.startswith(PREFIX):
                try:
                    q.put((self.role, json.loads(line[len(PREFIX):])))
                    continue
                except ValueError:
                    pass
            self.noise = (self.noise + [line.rstrip()[:300]])[-40:]
        q.put((self.role, None))

    @property
    def gone(self) -> bool:
        return self.gone_at is not None

    def send(self, command: str) -> bool:
        try:
            assert self.p.stdin is not None
            self.p.stdin.write(command + "\n")
            self.p.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def kill(self) -> None:
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGKILL)

    def close(self) -> None:
        if self.gone:
            # Its output ended: it is exiting; give it a moment before calling it stuck.
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.p.poll() is None:
            self.timed_out = self.killed_at is None
            self.kill()
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self.thread.join(timeout=5)
        self.err.close()

    def stderr_tail(self, chars: int = 2500) -> str:
        try:
            with open(self.err_path, errors="replace") as f:
                return f.read()[-chars:]
        except OSError:
            return ""

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pid": self.p.pid, "exit_code": self.p.returncode,
                               "ready": self.ready, "result": self.result, "error": self.error,
                               "done_at": self.done_at, "gone_at": self.gone_at,
                               "killed_at": self.killed_at, "timed_out": self.timed_out}
        if self.error or self.timed_out or (self.p.returncode not in (0, None)
                                            and self.killed_at is None):
            out["stderr_tail"] = self.stderr_tail()
            out["stdout_noise"] = self.noise
        return out


class Sampler:
    """The device's memory in use, from nvidia-smi every 100 ms (where it is)."""

    def __init__(self, enabled: bool) -> None:
        self.peak_mib = 0
        self.samples = 0
        self.p: subprocess.Popen[str] | None = None
        exe = shutil.which("nvidia-smi")
        if not enabled or exe is None:
            return
        device = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
        self.p = subprocess.Popen([exe, "-i", device, "--query-gpu=memory.used",
                                   "--format=csv,noheader,nounits", "-lms", "100"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p is not None and self.p.stdout is not None
        for line in self.p.stdout:
            try:
                self.peak_mib = max(self.peak_mib, int(line.strip()))
                self.samples += 1
            except ValueError:
                pass

    def stop(self) -> dict[str, Any] | None:
        if self.p is None:
            return None
        if self.p.poll() is None:
            self.p.terminate()
        try:
            self.p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        return {"peak_used_gib": round(self.peak_mib / 1024, 2), "samples": self.samples}


@dataclass
class Run:
    mode: str
    args: argparse.Namespace
    plan: Plan
    kids: dict[str, Child] = dataclasses.field(default_factory=dict)
    timeline: list[list[Any]] = dataclasses.field(default_factory=list)
    t0: float = 0.0
    kill_due: float | None = None
    killed: dict[str, Any] | None = None

    def argv(self, role: str, sequential: bool) -> list[str]:
        cfg = {
            "role": role, "mode": self.mode, "plan": dataclasses.asdict(self.plan),
            "sequential": sequential, "soft_shares": self.args.soft_shares,
            "retries": self.args.retries, "retry_wait": self.args.retry_wait,
            "prepare_sleep": not self.args.no_prepare_sleep,
            "dry_run_gib": self.args.dry_run_gib,
            "limit_s": self.args.setup_timeout + self.args.timeout,
        }
        return [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(cfg)]

    def now(self) -> float:
        return round(time.perf_counter() - self.t0, 4) if self.t0 else 0.0

    def handle(self, role: str, msg: dict[str, Any] | None) -> None:
        kid = self.kids[role]
        if msg is None:
            kid.gone_at = self.now()
            self.timeline.append([kid.gone_at, role, "exited"])
            return
        ev = msg.get("ev")
        if ev == "ready":
            kid.ready = msg
        elif ev == "result":
            kid.result = msg
            kid.done_at = self.now()
        elif ev == "error":
            kid.error = msg
        if ev != "ready":
            label = f"{ev}" + (f":{msg['i']}" if "i" in msg else "")
            kid.seen.add(label)
            self.timeline.append([self.now(), role, label])
            self.maybe_schedule_kill(role, label)

    def maybe_schedule_kill(self, role: str, label: str) -> None:
        at = self.args.kill_at
        if (self.args.kill is None or self.mode == "sequential" or self.kill_due is not None
                or self.killed is not None):
            return
        if at in (f"{role}:{label}", f"{role}:{label.split(':')[0]}"):
            self.kill_due = time.perf_counter() + self.args.kill_delay

    def pump(self, q: queue.Queue[Any], timeout: float = 0.05) -> None:
        try:
            role, msg = q.get(timeout=timeout)
        except queue.Empty:
            role = None
        if role is not None:
            self.handle(role, msg)
        if self.kill_due is not None and time.perf_counter() >= self.kill_due:
            victim = self.kids.get(self.args.kill)
            self.kill_due = None
            if victim is not None and not victim.gone:
                victim.kill()
                victim.killed_at = self.now()
                self.killed = {"role": victim.role, "pid": victim.p.pid, "at": self.args.kill_at,
                               "delay_s": self.args.kill_delay, "t": victim.killed_at}
                self.timeline.append([victim.killed_at, victim.role, "SIGKILL"])
            elif victim is not None:
                self.killed = {"role": victim.role, "pid": victim.p.pid, "at": self.args.kill_at,
                               "delay_s": self.args.kill_delay, "t": None,
                               "missed": "it had exited before the delay ran out"}

    def start(self, role: str, q: queue.Queue[Any], env: dict[str, str], logdir: str,
              sequential: bool) -> bool:
        kid = Child(role, self.argv(role, sequential), env, q, logdir)
        self.kids[role] = kid
        deadline = time.perf_counter() + self.args.setup_timeout
        while kid.ready is None and not kid.gone and time.perf_counter() < deadline:
            self.pump(q)
        return kid.ready is not None


def worker_env(mode: str, tmp: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name in ("RRMM_SHARE_GPU", "RRMM_AS_RMM"):
        env.pop(name, None)
    if mode == "rrmm":
        ledger = os.path.join(tmp, "ledger")
        os.mkdir(ledger, 0o700)
        env["RRMM_LEDGER_DIR"] = ledger
    return env


def run_mode(mode: str, args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    run = Run(mode, args, plan)
    q: queue.Queue[Any] = queue.Queue()
    tmp = tempfile.mkdtemp(prefix=f"w15-{mode}-")
    env = worker_env(mode, tmp)
    sampler: Sampler | None = None
    out: dict[str, Any] = {"mode": mode, "notes": []}
    if mode == "static":
        out["notes"].append(STATIC_NOTE)
    try:
        if mode == "sequential":
            sampler = Sampler(args.dry_run_gib is None)
            total = 0.0
            for role in ROLES:
                if not run.start(role, q, env, tmp, sequential=True):
                    out["error"] = f"{role} did not get ready"
                    break
                kid = run.kids[role]
                # The timeline counts the roles' work times one after another.
                run.t0 = time.perf_counter() - total
                kid.send("start")
                run.timeline.append([round(total, 4), role, "start"])
                deadline = time.perf_counter() + args.timeout
                while not kid.gone and time.perf_counter() < deadline:
                    run.pump(q)
                if kid.done_at is None:
                    out["error"] = f"{role} did not finish"
                    break
                total = kid.done_at
            out["wall_s"] = round(total, 4) if "error" not in out else None
        else:
            for role in ROLES:
                if not run.start(role, q, env, tmp, sequential=False):
                    out["error"] = f"{role} did not get ready"
                    break
            if "error" not in out:
                sampler = Sampler(args.dry_run_gib is None)
                run.t0 = time.perf_counter()
                for kid in run.kids.values():
                    kid.send("start")
                run.timeline.append([0.0, "*", "start"])
                out["wall_s"] = orchestrate(run, q)
    finally:
        for kid in run.kids.values():
            kid.close()
        if sampler is not None:
            out["device"] = sampler.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    out["roles"] = {r: k.report() for r, k in run.kids.items()}
    out["timeline"] = run.timeline
    out["killed"] = run.killed
    if args.kill and mode != "sequential":
        out["kill_asked"], out["kill_at"] = args.kill, args.kill_at
    return out


def orchestrate(run: Run, q: queue.Queue[Any]) -> float | None:
    """The shared schedule: C bursts once A is idle (or gone); A wakes once C has ended."""
    kids = run.kids
    a, b, c = kids["A"], kids["B"], kids["C"]
    c_go = a_wake = b_stop = False
    deadline = time.perf_counter() + run.args.timeout
    while not all(k.gone for k in kids.values()) and time.perf_counter() < deadline:
        run.pump(q)
        a_idle = "idle" in a.seen
        if not c_go and not c.gone and (a_idle or a.gone):
            c_go = c.send("go")
            run.timeline.append([run.now(), "C", "sent go"])
        if not a_wake and a_idle and c.gone and not a.gone:
            a_wake = a.send("wake")
            run.timeline.append([run.now(), "A", "sent wake"])
        if not b_stop and (c.gone or c.killed_at is not None) and not b.gone:
            b_stop = b.send("stop")
            run.timeline.append([run.now(), "B", "sent stop"])
    done = [k.done_at for k in kids.values() if k.done_at is not None and k.killed_at is None]
    if any(not k.gone for k in kids.values()) or not done:
        return None
    return max(done)


# ---------------------------------------------------------------------------- summaries


def _ms(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "median_ms": None, "max_ms": None}
    return {"n": len(values), "median_ms": round(statistics.median(values) * 1000, 1),
            "max_ms": round(max(values) * 1000, 1)}


def summarize(run: dict[str, Any], sequential_wall: float | None) -> dict[str, Any]:
    results = {r: v["result"] for r, v in run.get("roles", {}).items() if v.get("result")}
    history = [dict(e, role=r) for r, res in results.items() for e in res.get("history", [])]

    def kind(k: str) -> list[dict[str, Any]]:
        return [e for e in history if e.get("kind") == k]

    wall = run.get("wall_s")
    errors = {r: (v["error"] or {}).get("error", "") or ("timed out" if v["timed_out"] else "")
              for r, v in run.get("roles", {}).items()
              if v.get("error") or v.get("timed_out")}
    c_alloc = results.get("C", {}).get("alloc_s", {}).get("burst")
    a_wakes = [w["seconds"] for w in results.get("A", {}).get("wakes", [])]
    killed = run.get("killed")
    if run.get("kill_asked") and not killed:
        killed = {"role": run["kill_asked"], "at": run.get("kill_at"), "delay_s": None,
                  "t": None, "missed": "its moment never came"}
    survivors = [r for r in ROLES
                 if not (killed and killed["role"] == r and killed.get("t") is not None)]
    row = {
        "mode": run["mode"],
        "wall_s": wall,
        "ratio_to_sequential": round(wall / sequential_wall, 3)
        if wall and sequential_wall else None,
        "oom_errors": sum(len(res["ooms"]) for res in results.values()),
        "skipped_steps": sum(len(res["skipped"]) for res in results.values()),
        "ooms_by_role": {r: len(res["ooms"]) for r, res in results.items()},
        "skipped_by_role": {r: res["skipped"] for r, res in results.items() if res["skipped"]},
        "checksum_checks": sum(res["checks"] for res in results.values()),
        "checksum_mismatches": sum(len(res["mismatches"]) for res in results.values()),
        "asks": _ms([e["seconds"] for e in kind("asked")]),
        "gave": _ms([e["seconds"] for e in kind("gave")]),
        "slept": _ms([e["seconds"] for e in kind("slept")]),
        "woke": _ms([e["seconds"] for e in kind("woke")]),
        "refused": len(kind("refused")),
        "declined": len(kind("declined")),
        "given_by_trim_gib": round(sum(e.get("given", 0) for e in kind("gave")) / GIB, 2),
        "slept_gib": round(sum(e.get("given", 0) for e in kind("slept")) / GIB, 2),
        "woken_gib": round(sum(e.get("bytes", 0) for e in kind("woke")) / GIB, 2),
        "c_burst_alloc_ms": round(c_alloc * 1000, 1) if c_alloc is not None else None,
        "a_wake_ms": [round(s * 1000, 1) for s in a_wakes],
        "device_peak_used_gib": (run.get("device") or {}).get("peak_used_gib"),
        "errors": errors,
        "killed": killed,
        "notes": run.get("notes", []) + ([run["error"]] if run.get("error") else []),
    }
    if killed:
        row["survivors_ok"] = all(
            r in results and not results[r]["ooms"] and not results[r]["skipped"]
            and not results[r]["mismatches"] for r in survivors)
    return row


def print_summary(rows: list[dict[str, Any]], device: str, total: int | None) -> None:
    size = f"{total / GIB:.1f} GiB" if total else "?"
    print(f"W15 shared GPU, {device} (D = {size}); wall = start to last done, after warm-up")
    print(f"W15 {'mode':10} {'wall s':>7} {'x seq':>6} {'OOM':>4} {'skip':>5} {'bad sum':>7} "
          f"{'asks n/med/max ms':>19} {'C alloc ms':>10} {'sleep ms':>8} {'A wake ms':>10} {'slept':>6} "
          f"{'woken':>6} {'peak':>6}  notes")

    def f(v: Any, fmt: str = "") -> str:
        return "-" if v is None else format(v, fmt)

    for r in rows:
        asks = r["asks"]
        asks_s = f"{asks['n']}/{f(asks['median_ms'])}/{f(asks['max_ms'])}"
        wake = ",".join(str(w) for w in r["a_wake_ms"]) or "-"
        notes = list(r["notes"])
        if r["oom_errors"]:
            notes.append("OOM by role: " + " ".join(f"{k}{v}" for k, v in r["ooms_by_role"].items()))
        if r["skipped_by_role"]:
            notes.append("skipped: " + " ".join(f"{k}:{','.join(v)}"
                                                for k, v in r["skipped_by_role"].items())[:160])
        if r["errors"]:
            notes.append("errors: " + "; ".join(f"{k}: {v[:80]}" for k, v in r["errors"].items()))
        if r["killed"]:
            k = r["killed"]
            if k.get("missed"):
                notes.append(f"kill of {k['role']} at {k['at']} missed: {k['missed']}")
            else:
                notes.append(f"killed {k['role']} at {k['at']} (+{k['delay_s']} s, t={k['t']} s);"
                             f" survivors ok: {r.get('survivors_ok')}")
        print(f"W15 {r['mode']:10} {f(r['wall_s'], '.2f'):>7} {f(r['ratio_to_sequential'], '.2f'):>6} "
              f"{r['oom_errors']:>4} {r['skipped_steps']:>5} {r['checksum_mismatches']:>7} "
              f"{asks_s:>19} {f(r['c_burst_alloc_ms']):>10} {f(r['slept']['max_ms']):>8} {wake:>10} "
              f"{r['slept_gib']:>6.2f} {r['woken_gib']:>6.2f} {f(r['device_peak_used_gib']):>6}  "
              + " | ".join(notes))
    print("W15 columns: OOM = out-of-memory errors (each retry counted), skip = steps given up, "
          "bad sum = checksum mismatches; asks = the ledger's asks (asker's view), C alloc = C's "
          "burst allocation as CuPy saw it; sleep ms = the longest sleep on the giver's side; "
          "slept/woken/peak in GiB (peak: nvidia-smi)")


# --------------------------------------------------------------------------------- main


def parse_sets(items: list[str]) -> dict[str, Any]:
    fields = {f.name: f.type for f in dataclasses.fields(Plan)}
    out: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        if key not in fields:
            raise SystemExit(f"--set {item}: no plan field {key!r} ({', '.join(fields)})")
        out[key] = int(value) if fields[key] in (int, "int") else float(value)
    return out


def parse_shares(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        role, _, size = item.partition("=")
        if role not in ROLES or not size:
            raise SystemExit(f"--soft-share {item}: ROLE=SIZE with ROLE in A, B, C")
        if size.lower() not in ("default", "none"):
            out[role] = size
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--mode", choices=[*MODES, "all"], default="all")
    p.add_argument("--out", help="the JSON file (default: the summary only)")
    p.add_argument("--plan", action="store_true", help="print the schedule and its checks, no GPU")
    p.add_argument("--plan-gib", type=float, default=80.0, help="device size for --plan's GiB")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="change a plan field (fractions, counts), e.g. a_burst=0.18")
    p.add_argument("--scale", type=float, default=1.0, help="scales the work (passes, steps)")
    p.add_argument("--soft-share", action="append", default=None, metavar="ROLE=SIZE",
                   help="rrmm mode: a role's soft share (default A=25%%; ROLE=default for none)")
    p.add_argument("--kill", choices=ROLES, help="SIGKILL this role mid-phase (shared modes)")
    p.add_argument("--kill-at", help="ROLE:EVENT[:N] (default A:burst:1, B:spike:1, C:burst)")
    p.add_argument("--kill-delay", type=float, default=0.2)
    p.add_argument("--retries", type=int, default=5)
    p.add_argument("--retry-wait", type=float, default=0.2)
    p.add_argument("--reps", type=int, default=1, help="runs of each mode, interleaved")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for a mode's run")
    p.add_argument("--setup-timeout", type=float, default=180.0, help="seconds per start-up")
    p.add_argument("--no-prepare-sleep", action="store_true")
    p.add_argument("--dry-run-gib", type=float, default=None,
                   help="workers on NumPy with a pretend device of this size (protocol check)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker_main(args.worker)

    plan = Plan(**parse_sets(args.set)).scaled(args.scale)
    if args.dry_run_gib is not None and not any(s.startswith("b_matmul=") for s in args.set):
        plan = dataclasses.replace(plan, b_matmul=128)
    args.soft_shares = parse_shares(args.soft_share if args.soft_share is not None else ["A=25%"])
    if args.kill and not args.kill_at:
        args.kill_at = DEFAULT_KILL_AT[args.kill]
    ok = print_plan(plan, args.plan_gib, args.soft_shares)
    if args.plan:
        print("W15 plan checks:", json.dumps(plan.checks()))
        return 0 if ok else 1
    if not ok:
        print("W15: the plan does not put the peaks above the device and the live sum below it",
              file=sys.stderr)

    modes = list(MODES) if args.mode == "all" else [args.mode]
    if "rmm" in modes and args.dry_run_gib is None and importlib.util.find_spec("rmm") is None:
        modes.remove("rmm")
        print("W15: rmm is not installed: the rmm mode is left out", file=sys.stderr)
    runs: list[dict[str, Any]] = []
    for rep in range(args.reps):
        for mode in modes:
            print(f"W15 run: {mode} (rep {rep + 1}/{args.reps})", file=sys.stderr, flush=True)
            r = run_mode(mode, args, plan)
            r["rep"] = rep
            runs.append(r)
            print(f"W15 run: {mode} wall {r.get('wall_s')} s", file=sys.stderr, flush=True)

    seq = [r["wall_s"] for r in runs if r["mode"] == "sequential" and r.get("wall_s")]
    seq_wall = statistics.median(seq) if seq else None
    rows = []
    for mode in modes:
        mode_runs = [r for r in runs if r["mode"] == mode]
        per_run = [summarize(r, seq_wall) for r in mode_runs]
        walls = [x["wall_s"] for x in per_run if x["wall_s"]]
        row = dict(per_run[0])
        if len(per_run) > 1:
            # Medians of the walls; counts summed over repetitions.
            row["wall_s"] = round(statistics.median(walls), 4) if walls else None
            row["ratio_to_sequential"] = (round(row["wall_s"] / seq_wall, 3)
                                          if row["wall_s"] and seq_wall else None)
            for key in ("oom_errors", "skipped_steps", "checksum_checks", "checksum_mismatches"):
                row[key] = sum(x[key] for x in per_run)
            row["notes"] = row["notes"] + [f"{len(per_run)} reps: wall median; counts summed"]
        rows.append(row)

    device, total = "?", None
    for r in runs:
        for v in r.get("roles", {}).values():
            if v.get("ready"):
                device = v["ready"].get("device") or v["ready"].get("library", device)
                total = v["ready"].get("device_total")
                break
        if total:
            break
    if args.dry_run_gib is not None:
        device = "dry run (NumPy, no GPU)"
    print_summary(rows, device, total)
    if args.out:
        doc = {"benchmark": "W15 shared GPU", "argv": sys.argv[1:], "plan": dataclasses.asdict(plan),
               "phases": plan.phases(), "checks": plan.checks(), "soft_shares": args.soft_shares,
               "device": device, "device_total": total, "sequential_wall_s": seq_wall,
               "summary": rows, "runs": runs}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
