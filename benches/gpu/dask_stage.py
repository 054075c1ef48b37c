"""GPU stage `dask` (scripts/gpu_run.sh): dask-cuda's LocalCUDACluster with two workers on rrmm.

Mode `plugin`: LocalCUDACluster (no RMM options) + client.register_plugin(RRMMSetup(pool)), then
a dask.array computation on CuPy chunks whose memory comes from rrmm's pool on both GPUs
(CuPy's allocator set to rrmm's in every worker), and memory_report per GPU.
Mode `alias` (run under RRMM_AS_RMM=1): dask-cuda's own options (rmm_pool_size,
rmm_allocator_external_lib_list=["cupy"]) unchanged; dask-cuda's RMMSetup imports `rmm`, which is
rrmm; the same computation and report.
"""

from __future__ import annotations

import argparse
import json
import sys


def _chain() -> list[str]:
    import rrmm.mr

    names, mr = [], rrmm.mr.get_current_device_resource()
    while mr is not None:
        names.append(type(mr).__name__)
        mr = getattr(mr, "upstream_mr", None)
    return names


def _cupy_allocator_is_rrmm() -> bool:
    import cupy
    import rrmm.allocators.cupy as hook

    return cupy.cuda.get_allocator() is hook.rmm_cupy_allocator


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["plugin", "alias"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import cupy
    import dask.array as da
    from dask_cuda import LocalCUDACluster
    from distributed import Client
    from rrmm.dask import RRMMSetup, memory_report

    if args.mode == "plugin":
        cluster = LocalCUDACluster(n_workers=2, CUDA_VISIBLE_DEVICES="0,1")
    else:
        import rmm

        assert rmm.__name__ == "rrmm", rmm
        cluster = LocalCUDACluster(
            n_workers=2,
            CUDA_VISIBLE_DEVICES="0,1",
            rmm_pool_size="2GiB",
            rmm_allocator_external_lib_list=["cupy"],
        )
    with cluster, Client(cluster) as client:
        if args.mode == "plugin":
            client.register_plugin(
                RRMMSetup(initial_pool_size="2GiB", external_lib_list=["cupy"])
            )
        chains = client.run(_chain)
        hooks = client.run(_cupy_allocator_is_rrmm)
        x = da.random.random((40000, 40000), chunks=(5000, 5000)).map_blocks(cupy.asarray)
        total = float((x @ x.T).sum().compute())
        report = memory_report(client)
        print(f"mode {args.mode}: sum {total:.6g}")
        print("resource chains:", json.dumps(chains))
        print("cupy allocator is rrmm's:", json.dumps(hooks))
        print(report)
        ok = all("PoolMemoryResource" in c for c in chains.values()) and all(hooks.values())
        ok = ok and len(report.rows) == 2 and all(r.footprint > 0 for r in report.rows)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"mode": args.mode, "ok": ok, "rows": report.as_dicts()}, f, indent=1)
        print("dask", args.mode, "OK" if ok else "FAILED")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
