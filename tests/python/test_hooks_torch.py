"""GPU tests of rrmm.allocators.torch (skipped without PyTorch or a GPU).

PyTorch lets a process choose its allocator once, before its first CUDA allocation, so every
check runs in a fresh interpreter.
"""

import conftest
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device for PyTorch", allow_module_level=True)


def run_fresh(code):
    """Runs `code` in a new interpreter; returns its stdout (fails on a non-zero exit)."""
    return conftest.run_fresh(code, timeout=240)


PRELUDE = """
import gc
import torch
import rrmm
from rrmm.allocators.torch import rmm_torch_allocator
""" + conftest.HOOK_HELPERS


def test_symbols_are_exported():
    import ctypes

    from rrmm import _rrmm
    from rrmm.allocators import torch as hook

    lib = ctypes.CDLL(hook.library_path())
    alloc_name, free_name = hook.symbols()
    alloc = ctypes.cast(getattr(lib, alloc_name), ctypes.c_void_p).value
    free = ctypes.cast(getattr(lib, free_name), ctypes.c_void_p).value
    assert (alloc, free) == _rrmm.torch_allocator_addresses()


def test_real_training_step_and_statistics():
    out = run_fresh(
        PRELUDE
        + """
torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
mr = rrmm_mr("StatisticsResourceAdaptor")
stats = None
if mr is not None:
    stats = mr.StatisticsResourceAdaptor(mr.CudaMemoryResource())
    mr.set_current_device_resource(stats)
torch.manual_seed(0)
a = torch.randn(512, 256)
b = torch.randn(256, 128)
ga, gb = a.cuda(), b.cuda()
assert torch.allclose((ga @ gb).cpu(), a @ b, rtol=1e-3, atol=1e-3)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(1024, 64, device="cuda")
y = x[:, :1] * 3.0 + 1.0
first = None
for _ in range(200):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    first = first if first is not None else loss.item()
assert loss.item() < 0.1 * first, (first, loss.item())
if stats is not None:
    t = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    before = count(stats, "current_bytes")
    assert before >= 1 << 20, stats.allocation_counts
    del t
    assert count(stats, "current_bytes") <= before - (1 << 20), stats.allocation_counts
    assert count(stats, "peak_bytes") >= 1 << 20
    print("STATS")
print("OK")
"""
    )
    assert "OK" in out


def test_streams_are_passed_through():
    out = run_fresh(
        PRELUDE
        + """
import os, tempfile
torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
mr = rrmm_mr("LoggingResourceAdaptor")
s = torch.cuda.Stream()
if mr is not None:
    path = os.path.join(tempfile.mkdtemp(), "log.csv")
    log = mr.LoggingResourceAdaptor(mr.CudaMemoryResource(), log_file_name=path)
    mr.set_current_device_resource(log)
with torch.cuda.stream(s):
    t = torch.ones(12345, device="cuda")
    u = t * 2
s.synchronize()
assert u.sum().item() == 24690.0
if mr is not None:
    del t, u
    log.flush()
    name = log.get_file_name() if hasattr(log, "get_file_name") else path
    rows = open(name).read().splitlines()
    streams = {r.split(",")[5].strip().lower() for r in rows[1:] if r.split(",")[2] == "allocate"}
    assert any(int(v, 16) == s.cuda_stream for v in streams if v), (streams, hex(s.cuda_stream))
    print("LOGGED")
print("OK")
"""
    )
    assert "OK" in out


def test_out_of_memory_is_torchs_out_of_memory_error_with_rrmms_message():
    out = run_fresh(
        PRELUDE
        + """
torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
mr = rrmm_mr("LimitingResourceAdaptor")
if mr is not None:
    mr.set_current_device_resource(
        mr.LimitingResourceAdaptor(mr.CudaMemoryResource(), allocation_limit=8 << 20))
    request = 64 << 20
else:
    request = 1 << 50  # more than any device has: the CUDA resource fails
small = torch.ones(1000, device="cuda")
try:
    torch.empty(request, dtype=torch.uint8, device="cuda")
except torch.cuda.OutOfMemoryError as exc:  # PyTorch's own type, as with its allocator
    text = str(exc)
    assert "out_of_memory" in text and "request: 64.00 MiB" in text, text
    assert "hint:" in text, text
    print("RAISED", type(exc).__name__, text[:200])
else:
    raise AssertionError("no error")
assert small.sum().item() == 1000.0
again = torch.ones(1000, device="cuda")
assert again.sum().item() == 1000.0
print("OK")
"""
    )
    assert "RAISED" in out and "OK" in out


def test_mem_pool():
    out = run_fresh(
        PRELUDE
        + """
if not hasattr(torch.cuda, "MemPool"):
    print("NOPOOL")
else:
    pool = torch.cuda.MemPool(rmm_torch_allocator.allocator())
    with torch.cuda.use_mem_pool(pool):
        x = torch.arange(100000, device="cuda", dtype=torch.float64)
    y = torch.arange(100000, device="cuda", dtype=torch.float64)
    assert (x == y).all().item()
    assert x.sum().item() == 99999 * 100000 / 2
    del x
    print("OK")
"""
    )
    if "NOPOOL" in out:
        pytest.skip("this PyTorch has no torch.cuda.MemPool")
    assert "OK" in out
