"""Checks that PyTorch's memory tools read an rrmm snapshot (GPU machine with torch installed).

    python benches/gpu/memory_viz_check.py --out snapshot_viz

Builds an expandable pool and a pool, makes some blocks, trims, and feeds
``rrmm.memory_snapshot()`` to ``torch.cuda._memory_viz``: ``segsum`` (which asserts that blocks
cover their segments), ``segments``/``memory`` (flamegraph input), and ``segment_plot`` (the
HTML page). Writes ``<out>/<resource>.pickle`` (open it at https://pytorch.org/memory_viz) and
``<out>/<resource>.html``, and prints ``rrmm.statistics.memory_stats()``.
"""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path

import rrmm

MIB = 1 << 20


def exercise(resource: str, out: Path) -> None:
    from torch.cuda import _memory_viz

    if resource == "expandable":
        rrmm.reinitialize(pool_allocator="expandable")
    else:
        rrmm.reinitialize(pool_allocator=True, initial_pool_size="256MiB")
    bufs = [rrmm.DeviceBuffer(size=(i % 7 + 1) * 3 * MIB + 100 * i) for i in range(40)]
    del bufs[::3]
    mr = rrmm.mr.get_current_device_resource()
    if hasattr(mr, "trim"):
        print(f"{resource}: trimmed {mr.trim()} bytes")
    snap = rrmm.memory_snapshot()
    print(_memory_viz.segsum(snap))
    lines = _memory_viz.segments(snap, format_flamegraph=lambda text: text)
    assert lines.strip(), "no flamegraph lines"
    _memory_viz.memory(snap, format_flamegraph=lambda text: text)
    html = _memory_viz.segment_plot(snap)
    assert "snapshot.pickle" in html
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{resource}.html").write_text(html)
    with open(out / f"{resource}.pickle", "wb") as f:
        pickle.dump(snap, f)
    stats = rrmm.statistics.memory_stats()
    for key in ("allocated_bytes.all.current", "reserved_bytes.all.current",
                "inactive_split_bytes.all.current", "segment.all.current", "num_device_alloc"):
        print(f"  {key} = {stats[key]}")
    del bufs
    rrmm.reinitialize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="snapshot_viz")
    args = ap.parse_args()
    for resource in ("expandable", "pool"):
        exercise(resource, Path(args.out))
    print("ok: torch.cuda._memory_viz read both snapshots")


if __name__ == "__main__":
    main()
