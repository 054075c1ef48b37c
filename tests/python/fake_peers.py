"""Stand-ins for the parts of PyTorch and CuPy that ``rrmm._replay_peers`` calls, for tests
without a GPU: a caching allocator that hands out addresses, caches freed blocks per stream,
tracks the bytes it reserves and raises the framework's out-of-memory error past its limit
(after emptying its cache, as both frameworks do).

``make_torch(total)`` and ``make_cupy(total)`` return the module to put in ``sys.modules`` and
the allocator (the pools CuPy made) to inspect."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Any

ROUND = 512


class FakeCache:
    """The allocator behind both fakes. A request is rounded up to 512 bytes; the smallest
    cached block of its stream that fits is reused whole, else a new block is reserved; past
    ``limit`` the cache is emptied and, if that is not enough, ``oom`` raised."""

    def __init__(self, total: int, oom: type[BaseException]) -> None:
        self.total = total
        self.limit: int | None = None
        self.oom = oom
        self.reserved = 0
        self.peak = 0
        self.active: dict[int, tuple[int, int, int]] = {}  # ptr -> (block, requested, stream)
        self.cached: list[tuple[int, int, int]] = []  # (ptr, block, stream)
        self.next_address = 0x10_0000
        self.requested_in_use = 0
        self.calls: list[tuple[str, int, int]] = []  # (alloc/free, size, stream)
        self.successes = 0
        self.failures = 0

    def alloc(self, size: int, stream: int) -> int:
        self.calls.append(("alloc", size, stream))
        if size == 0:
            self.successes += 1
            return 0
        block = -(-size // ROUND) * ROUND
        fits = [c for c in self.cached if c[2] == stream and c[1] >= block]
        if fits:
            ptr, block, _ = min(fits, key=lambda c: c[1])
            self.cached.remove((ptr, block, stream))
        else:
            limit = self.total if self.limit is None else self.limit
            if self.reserved + block > limit:
                self.empty_cache()
            if self.reserved + block > limit:
                self.failures += 1
                raise self.oom(f"fake: {size} bytes past the limit of {limit}")
            ptr = self.next_address
            self.next_address += block + 4096
            self.reserved += block
            self.peak = max(self.peak, self.reserved)
        self.active[ptr] = (block, size, stream)
        self.requested_in_use += size
        self.successes += 1
        return ptr

    def free(self, ptr: int) -> None:
        if ptr == 0:
            return
        block, size, stream = self.active.pop(ptr)  # KeyError: a free of what is not live
        self.calls.append(("free", size, stream))
        self.requested_in_use -= size
        assert self.requested_in_use >= 0, "more freed than allocated"
        self.cached.append((ptr, block, stream))

    def empty_cache(self) -> None:
        self.reserved -= sum(c[1] for c in self.cached)
        self.cached = []

    def snapshot(self) -> list[dict[str, Any]]:
        """PyTorch-style segments, one block each."""
        blocks = [(p, b, "active_allocated") for p, (b, _, _) in self.active.items()]
        blocks += [(p, b, "inactive") for p, b, _ in self.cached]
        return [{"device": 0, "address": p, "total_size": b,
                 "blocks": [{"address": p, "size": b, "state": state}]}
                for p, b, state in sorted(blocks)]


class FakeTorchOutOfMemoryError(RuntimeError):
    """torch.cuda.OutOfMemoryError is a RuntimeError."""


class FakeTorchStream:
    _next = 0x7000

    def __init__(self, device: int | None = None, handle: int | None = None) -> None:
        if handle is None:
            FakeTorchStream._next += 0x10
            handle = FakeTorchStream._next
        self.cuda_stream = handle


def make_torch(total: int = 1 << 30, available: bool = True) -> tuple[ModuleType, FakeCache]:
    """A fake ``torch`` module (``torch.cuda``'s allocator API) and its allocator."""
    cache = FakeCache(total, FakeTorchOutOfMemoryError)
    torch = ModuleType("torch")
    cuda = ModuleType("torch.cuda")
    torch.cuda = cuda  # type: ignore[attr-defined]
    torch.__version__ = "0.0+fake"  # type: ignore[attr-defined]

    def alloc(size: int, device: int | None = None, stream: Any = None) -> int:
        assert device == 0 and isinstance(stream, int), (device, stream)
        return cache.alloc(size, stream)

    def set_fraction(fraction: float, device: int | None = None) -> None:
        assert 0.0 <= fraction <= 1.0
        cache.limit = round(fraction * total)

    def reset_peak(device: int | None = None) -> None:
        cache.peak = cache.reserved

    cuda.__dict__.update(
        is_available=lambda: available,
        current_device=lambda: 0,
        get_device_properties=lambda device: SimpleNamespace(total_memory=total),
        synchronize=lambda device=None: None,
        empty_cache=cache.empty_cache,
        set_per_process_memory_fraction=set_fraction,
        OutOfMemoryError=FakeTorchOutOfMemoryError,
        default_stream=lambda device=None: FakeTorchStream(device, 0),
        Stream=FakeTorchStream,
        caching_allocator_alloc=alloc,
        caching_allocator_delete=cache.free,
        reset_peak_memory_stats=reset_peak,
        memory_reserved=lambda device=None: cache.reserved,
        max_memory_reserved=lambda device=None: cache.peak,
        memory_snapshot=cache.snapshot,
    )
    return torch, cache


class FakeCupyOutOfMemoryError(MemoryError):
    """cupy.cuda.memory.OutOfMemoryError is a MemoryError."""


def make_cupy(total: int = 1 << 30) -> tuple[ModuleType, list[FakeCache]]:
    """A fake ``cupy`` module (``cupy.cuda``'s MemoryPool, streams, device) and the caches of
    the pools made from it, in order."""
    cupy = ModuleType("cupy")
    cuda = ModuleType("cupy.cuda")
    memory = ModuleType("cupy.cuda.memory")
    cupy.cuda = cuda  # type: ignore[attr-defined]
    cupy.__version__ = "0.0+fake"  # type: ignore[attr-defined]
    cuda.memory = memory  # type: ignore[attr-defined]
    memory.OutOfMemoryError = FakeCupyOutOfMemoryError  # type: ignore[attr-defined]
    pools: list[FakeCache] = []
    state = {"current": 0}

    class Stream:
        _next = 0x9000

        def __init__(self, non_blocking: bool = False, handle: int | None = None) -> None:
            if handle is None:
                Stream._next += 0x10
                handle = Stream._next
            self.ptr = handle

        def use(self) -> Stream:
            state["current"] = self.ptr
            return self

    Stream.null = Stream(handle=0)  # type: ignore[attr-defined]

    class Pointer:
        def __init__(self, cache: FakeCache, ptr: int) -> None:
            self.cache, self.ptr = cache, ptr

        def __del__(self) -> None:
            self.cache.free(self.ptr)

    class MemoryPool:
        def __init__(self) -> None:
            self.cache = FakeCache(total, FakeCupyOutOfMemoryError)
            pools.append(self.cache)

        def malloc(self, size: int) -> Pointer:
            return Pointer(self.cache, self.cache.alloc(size, state["current"]))

        def total_bytes(self) -> int:
            return self.cache.reserved

        def free_all_blocks(self) -> None:
            self.cache.empty_cache()

        def set_limit(self, size: int | None = None, fraction: float | None = None) -> None:
            self.cache.limit = size

    class Device:
        def __init__(self, device: int = 0) -> None:
            self.id = device
            self.mem_info = (total, total)

        def synchronize(self) -> None:
            pass

    cuda.__dict__.update(is_available=lambda: True, MemoryPool=MemoryPool, Stream=Stream,
                         Device=Device)
    return cupy, pools


class AddressAllocator:
    """A pure-Python allocator for the engine's replays through Python functions (the path of
    PyTorch's and CuPy's allocators) without a GPU: addresses from a counter, a dict of live
    blocks, ``capacity`` bytes charged as rrmm's simulated device charges them (2 MiB pages from
    2 MiB, else 256-byte units); past it ``oom`` is raised. ``fail_on(n)`` makes the n-th allocation
    (from 0) raise ``error`` instead."""

    UNIT = 256
    PAGE = 2 << 20

    def __init__(self, capacity: int, oom: type[BaseException] = MemoryError) -> None:
        self.capacity = capacity
        self.oom = oom
        self.live: dict[int, int] = {}  # address -> charged bytes
        self.charged = 0
        self.peak_charged = 0
        self.next_address = 0x1_0000_0000
        self.allocations = self.frees = self.failures = 0
        self.streams: set[int] = set()
        self.error: BaseException | None = None
        self.error_at: int | None = None

    def fail_on(self, n: int, error: BaseException) -> None:
        self.error_at, self.error = n, error

    def allocate(self, size: int, stream: int) -> int:
        self.streams.add(stream)
        if self.error_at is not None and self.allocations + self.failures == self.error_at:
            self.failures += 1
            assert self.error is not None
            raise self.error
        unit = self.PAGE if size >= self.PAGE else self.UNIT
        charge = -(-size // unit) * unit
        if self.charged + charge > self.capacity:
            self.failures += 1
            raise self.oom(f"fake: {size} bytes past the capacity of {self.capacity}")
        self.allocations += 1
        if size == 0:
            return 0
        ptr = self.next_address
        self.next_address += charge + 4096
        self.live[ptr] = charge
        self.charged += charge
        self.peak_charged = max(self.peak_charged, self.charged)
        return ptr

    def deallocate(self, ptr: int, size: int, stream: int) -> None:
        self.streams.add(stream)
        self.charged -= self.live.pop(ptr)  # KeyError: a free of what is not live
        self.frees += 1

    def held_bytes(self) -> int:
        return self.charged
