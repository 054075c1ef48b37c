"""The PyTorch hook's out-of-memory exception, without PyTorch.

rrmm's shim (csrc/torch_shim.cpp) throws through the C++ runtime of the PyTorch libraries loaded
in the process, never its own (a release wheel links zig's): PyTorch's own
``c10::OutOfMemoryError`` (``torch.cuda.OutOfMemoryError``) for the PyTorch versions rrmm was
tested with whose layout checks pass, else ``rrmm::out_of_memory`` (a ``std::bad_alloc``,
PyTorch's ``RuntimeError``); with no PyTorch library loaded it returns null and says so once.

A stand-in libc10.so (data/fake_c10.cpp, built here with the system's C++ compiler and
libstdc++) plays several PyTorch versions (layouts), catches as PyTorch does and counts the
throws made through its runtime. The real thing is checked on the GPU in test_hooks_torch.py;
``RRMM_TEST_TORCH_LIB`` (a PyTorch wheel's ``torch/lib`` folder) runs the check against a real
release's libc10/libc10_cuda on CPU.

Each check runs in a fresh interpreter: the stand-in must be the only libc10.so in the process.
"""

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rrmm import _rrmm

COMPILER = shutil.which("g++") or shutil.which("c++")
SOURCE = Path(__file__).parent / "data" / "fake_c10.cpp"
TESTED = tuple(_rrmm.torch_tested_versions())

pytestmark = pytest.mark.skipif(
    COMPILER is None, reason="no C++ compiler to build a stand-in libc10"
)

# The stand-in's layouts (data/fake_c10.cpp): 1 as the tested releases, 2 OutOfMemoryError adds a
# virtual function and a member, 3 it adds only a member.
LAYOUTS = (1, 2, 3)


def build(directory: Path, name: str, layout: int = 1) -> Path:
    out = directory / name
    assert COMPILER is not None
    subprocess.run(
        [COMPILER, "-std=c++17", "-shared", "-fPIC", "-O1", f"-DFAKE_C10_LAYOUT={layout}",
         f"-Wl,-soname,{name}", "-o", str(out), str(SOURCE), "-ldl"],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    return {
        layout: build(tmp_path_factory.mktemp(f"fake_c10_{layout}"), "libc10.so", layout)
        for layout in LAYOUTS
    }


def is_tested(version: str) -> bool:
    """The rule the hook applies to ``torch.__version__``: a release ``major.minor.patch`` (any
    ``+local`` tag) whose ``major.minor`` was tested."""
    match = re.fullmatch(r"([0-9]+)\.([0-9]+)\.[0-9]+(\+.*)?", version, re.DOTALL)
    return match is not None and f"{int(match[1])}.{int(match[2])}" in TESTED


def run_child(code: str, timeout: float = 120) -> tuple[str, str]:
    """Runs ``code`` in a fresh interpreter; returns (stdout, stderr), failing on a non-zero exit
    (a crash of the unwinder included)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, proc.stderr


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

def caught_type(fake):
    fake.fake_c10_caught_type.restype = ctypes.c_char_p
    return fake.fake_c10_caught_type().decode()

mr.set_per_device_resource(
    0, mr.LimitingResourceAdaptor(mr.SimulatedMemoryResource(1 << 30), allocation_limit=1 << 20))
"""

RRMM_MESSAGE = "std::bad_alloc: out_of_memory: Exceeded memory limit"


def check_versions(stand_in: Path, layout: int, versions: list[str]) -> str:
    """Configures the shim with each version in turn over the stand-in of ``layout`` and checks
    the exception an allocation failure then throws; returns the child's standard error."""
    expected = [
        "OutOfMemoryError" if layout == 1 and is_tested(v) else "bad_alloc" for v in versions
    ]
    _, err = run_child(
        CALLER
        + f"""
fake = ctypes.CDLL({str(stand_in)!r})  # loaded privately, as PyTorch loads libc10
call = caller(fake)
for version, expected in zip({versions!r}, {expected!r}):
    mode = _rrmm.torch_shim_configure(version)
    assert mode == expected, (version, mode, expected)
    throws = fake.fake_c10_throws()
    code, text = call(4 << 20)
    # Thrown through the stand-in's runtime (its __cxa_throw), never the shim's own.
    assert fake.fake_c10_throws() == throws + 1, (version, throws)
    if expected == "OutOfMemoryError":
        assert code == 1, (version, code, text)  # caught as c10::OutOfMemoryError
        assert caught_type(fake) == "N3c1016OutOfMemoryErrorE", caught_type(fake)
    else:
        assert code == 5, (version, code, text)  # caught as std::bad_alloc
        assert caught_type(fake) == "N4rrmm13out_of_memoryE", caught_type(fake)
    assert text.startswith({RRMM_MESSAGE!r}), text
    assert "hint: a limiting adaptor's allocation_limit" in text, text
    code, text = call(4096)  # the resource keeps working after each throw
    assert code == 0, (code, text)
print("OK")
""",
    )
    return err


local_tags = st.from_regex(r"cu1[0-9]{2}|cpu|rocm6\.[0-9]", fullmatch=True)
tested_versions = st.builds(
    lambda release, patch, local: f"{release}.{patch}" + (f"+{local}" if local else ""),
    st.sampled_from(TESTED), st.integers(0, 12), st.one_of(st.none(), local_tags),
)
pre_releases = st.sampled_from(["a0", "rc1", ".dev20260101", "b2"])
untested_versions = st.one_of(
    st.builds(lambda a, b, c: f"{a}.{b}.{c}", st.integers(0, 40), st.integers(0, 40),
              st.integers(0, 9)),
    st.builds(lambda v, pre: f"{v}.0{pre}", st.sampled_from(TESTED), pre_releases),
    st.text(max_size=12),
)
versions = st.lists(st.one_of(tested_versions, untested_versions), min_size=1, max_size=8)


@settings(max_examples=4, deadline=None)
@given(versions)
def test_a_tested_pytorch_gets_its_out_of_memory_error_any_other_the_fallback(
    stand_ins: dict[int, Path], versions: list[str]
) -> None:
    check_versions(stand_ins[1], 1, versions)


@pytest.mark.parametrize("layout", [2, 3])
@settings(max_examples=2, deadline=None)
@given(versions=versions)
def test_a_pytorch_unlike_the_tested_ones_gets_the_fallback(
    stand_ins: dict[int, Path], layout: int, versions: list[str]
) -> None:
    # Layout 3 (a member added, nothing else) cannot be told from outside: only the version
    # gate keeps the forged exception away from it, so it is given untested versions only.
    if layout == 3:
        versions = [v for v in versions if not is_tested(v)] or ["99.0.0"]
    check_versions(stand_ins[layout], layout, versions)


def test_a_tested_version_with_another_layout_is_refused_and_said_once(
    stand_ins: dict[int, Path],
) -> None:
    version = TESTED[0] + ".0"
    err = check_versions(stand_ins[2], 2, [version, version, version])
    assert err.count("not laid out as in the PyTorch versions rrmm was tested with") == 1, err
    assert "a vtable's size differs" in err, err


def test_without_pytorch_loaded_it_returns_null_and_says_so_once(tmp_path: Path) -> None:
    # The stand-in under another name: no PyTorch library is in the process.
    renamed = build(tmp_path, "libnot_c10.so")
    _, err = run_child(
        CALLER
        + f"""
fake = ctypes.CDLL({str(renamed)!r})
call = caller(fake)
assert _rrmm.torch_shim_configure("{TESTED[0]}.0") == "null"
for _ in range(3):
    code, text = call(4 << 20)
    assert code == 6, (code, text)  # a null pointer, nothing thrown
assert fake.fake_c10_throws() == 0
code, text = call(4096)
assert code == 0, (code, text)
print("OK")
"""
    )
    assert err.count("no PyTorch C++ runtime is loaded") == 1, err
    assert "Exceeded memory limit" in err, err


def test_a_failure_before_set_up_gets_the_fallback(stand_ins: dict[int, Path]) -> None:
    # The entry points used without rrmm's hook (no version told): never the forged exception.
    out, _ = run_child(
        CALLER
        + f"""
fake = ctypes.CDLL({str(stand_ins[1])!r})
code, text = caller(fake)(4 << 20)
assert code == 5 and caught_type(fake) == "N4rrmm13out_of_memoryE", (code, text)
print("OK")
"""
    )
    assert "OK" in out


TORCH_LIB = os.environ.get("RRMM_TEST_TORCH_LIB")


@pytest.mark.skipif(
    TORCH_LIB is None or shutil.which("nm") is None or shutil.which("gcc") is None,
    reason="RRMM_TEST_TORCH_LIB (a PyTorch wheel's torch/lib) not given, or no nm/gcc",
)
def test_a_real_pytorch_release_on_cpu(tmp_path: Path) -> None:
    """The real libc10/libc10_cuda of a PyTorch wheel (its version read from torch/version.py),
    loaded on CPU over a stub libcudart, and the stand-in as the catching caller only."""
    assert TORCH_LIB is not None
    lib = Path(TORCH_LIB)
    version_py = (lib.parent / "version.py").read_text()
    match = re.search(r"__version__ = '([^']+)'", version_py)
    assert match is not None
    version = match[1]
    # A stub libcudart with the version node and functions libc10_cuda.so asks for.
    needed = subprocess.run(["readelf", "-d", str(lib / "libc10_cuda.so")], capture_output=True,
                            text=True, check=True).stdout
    cudart = re.search(r"\[(libcudart\.so\.[0-9]+)\]", needed)
    assert cudart is not None
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(lib / "libc10_cuda.so")],
                               capture_output=True, text=True, check=True).stdout
    names = sorted({line.split()[-1].split("@")[0] for line in undefined.splitlines()
                    if f"@{cudart[1]}" in line})
    (tmp_path / "stub.c").write_text("".join(f"int {n}(void) {{ return 1; }}\n" for n in names))
    (tmp_path / "stub.map").write_text(f"{cudart[1]} {{ global: *; }};\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / cudart[1]),
                    f"-Wl,-soname,{cudart[1]}", f"-Wl,--version-script={tmp_path / 'stub.map'}",
                    str(tmp_path / "stub.c")], check=True)
    catcher = build(tmp_path, "libfake_catcher.so")
    expected = "OutOfMemoryError" if is_tested(version) else "bad_alloc"
    run_child(
        CALLER
        + f"""
ctypes.CDLL({str(tmp_path / cudart[1])!r})
ctypes.CDLL({str(lib / "libc10.so")!r})
ctypes.CDLL({str(lib / "libc10_cuda.so")!r})
fake = ctypes.CDLL({str(catcher)!r})
call = caller(fake)
mode = _rrmm.torch_shim_configure({version!r})
assert mode == {expected!r}, mode
for _ in range(3):
    code, text = call(4 << 20)
    if mode == "OutOfMemoryError":
        assert code == 1 and caught_type(fake) == "N3c1016OutOfMemoryErrorE", (code, text)
    else:
        assert code == 5 and caught_type(fake) == "N4rrmm13out_of_memoryE", (code, text)
    assert {RRMM_MESSAGE!r} in text, text
    assert fake.fake_c10_throws() == 0  # thrown by PyTorch's runtime, not the catcher's
print("OK")
"""
    )


def torch_on_gpu() -> str | None:
    """Why the real-PyTorch GPU checks cannot run here, or None when they can."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device for PyTorch"
    return None


GPU_CALLER = """
import torch
import rrmm.mr as mr
from rrmm import _rrmm
from rrmm.allocators import torch as hook

torch.cuda.memory.change_current_allocator(hook.rmm_torch_allocator)
mr.set_current_device_resource(
    mr.LimitingResourceAdaptor(mr.CudaMemoryResource(), allocation_limit=8 << 20))
small = torch.ones(1000, device="cuda")

def failure():
    try:
        torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    except Exception as exc:  # noqa: BLE001
        assert "Exceeded memory limit" in str(exc) and "hint:" in str(exc), str(exc)
        return exc
    raise AssertionError("no error")
"""


@pytest.mark.skipif(torch_on_gpu() is not None, reason=str(torch_on_gpu()))
def test_real_pytorch_on_gpu_each_mode() -> None:
    """With the real PyTorch: its tested version raises torch.cuda.OutOfMemoryError; the same
    process told an untested version raises a plain RuntimeError (the fallback, thrown through
    PyTorch's runtime); the allocator keeps working after each."""
    out, _ = run_child(
        GPU_CALLER
        + """
tested = hook.out_of_memory_mode() == "OutOfMemoryError"
if tested:
    assert isinstance(failure(), torch.cuda.OutOfMemoryError)
assert _rrmm.torch_shim_configure("99.0.0") == "bad_alloc"
exc = failure()
assert isinstance(exc, RuntimeError), type(exc)
assert not isinstance(exc, torch.cuda.OutOfMemoryError), type(exc)
assert small.sum().item() == 1000.0
assert torch.ones(1000, device="cuda").sum().item() == 1000.0
print("OK", torch.__version__, tested)
""",
        timeout=240,
    )
    assert "OK" in out
    version = out.split()[1]
    assert (out.split()[2] == "True") == is_tested(version), out
