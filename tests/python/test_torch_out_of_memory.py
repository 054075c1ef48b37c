"""The PyTorch hook's out-of-memory exception, without PyTorch: rrmm's shim throws PyTorch's own
``c10::OutOfMemoryError`` (which PyTorch turns into ``torch.cuda.OutOfMemoryError``) when a
PyTorch library is loaded, found at run time by symbol. A stand-in libc10.so (data/fake_c10.cpp,
built here with the system's C++ compiler) defines the class with another layout and catches as
PyTorch does; the real thing is checked on the GPU in test_hooks_torch.py.

Each check runs in a fresh interpreter: the stand-in must be the only libc10.so in the process.
"""

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import run_fresh

COMPILER = shutil.which("g++") or shutil.which("c++")
SOURCE = Path(__file__).parent / "data" / "fake_c10.cpp"

pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler to build a stand-in libc10")


def build(directory: Path, name: str) -> Path:
    out = directory / name
    assert COMPILER is not None
    subprocess.run(
        [COMPILER, "-std=c++17", "-shared", "-fPIC", "-O1", f"-Wl,-soname,{name}",
         "-o", str(out), str(SOURCE)],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="module")
def fake_c10(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("fake_c10"), "libc10.so")


CALLER = """
import ctypes
import rrmm.mr as mr
from rrmm import _rrmm

def caller(fake):
    fake.fake_torch_allocate.restype = ctypes.c_int
    fake.fake_torch_allocate.argtypes = [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    alloc = ctypes.cast(ctypes.CDLL(_rrmm.__file__).rrmm_torch_allocate, ctypes.c_void_p)
    buf = ctypes.create_string_buffer(8192)
    def call(size):
        code = fake.fake_torch_allocate(alloc, size, buf, len(buf))
        return code, buf.value.decode()
    return call

mr.set_per_device_resource(
    0, mr.LimitingResourceAdaptor(mr.SimulatedMemoryResource(1 << 30), allocation_limit=1 << 20))
"""


def test_out_of_memory_is_pytorchs_own_type_with_rrmms_message(fake_c10: Path) -> None:
    out = run_fresh(
        CALLER
        + f"""
fake = ctypes.CDLL({str(fake_c10)!r})  # loaded privately, as PyTorch loads libc10
call = caller(fake)
for _ in range(3):  # the lookup is kept; the resource keeps working after each throw
    code, text = call(4 << 20)
    assert code == 1, (code, text)  # caught as c10::OutOfMemoryError
    assert text.startswith("std::bad_alloc: out_of_memory: Exceeded memory limit"), text
    assert "hint: a limiting adaptor's allocation_limit" in text, text
code, text = call(4096)
assert code == 0, (code, text)
print("OK")
""",
        timeout=120,
    )
    assert "OK" in out


def test_without_pytorch_loaded_it_is_a_bad_alloc(tmp_path: Path) -> None:
    # The stand-in under another name: no library called libc10.so is in the process.
    renamed = build(tmp_path, "libnot_c10.so")
    out = run_fresh(
        CALLER
        + f"""
fake = ctypes.CDLL({str(renamed)!r})
code, text = caller(fake)(4 << 20)
assert code == 3, (code, text)  # a std::exception (std::bad_alloc), not OutOfMemoryError
assert "Exceeded memory limit" in text, text
print("OK")
""",
        timeout=120,
    )
    assert "OK" in out
