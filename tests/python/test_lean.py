"""CPU tests of rrmm.allocators._lean: objects built without their constructor are the same
objects, and anything the check cannot show to be the same falls back (None)."""

from rrmm.allocators._lean import lean_maker


class Pointer:
    """Stands for cuda.bindings' CUdeviceptr: an object wrapping an address."""

    def __init__(self, address):
        self.address = address


class Context:
    pass


CONTEXT = Context()


class PlainMemoryPointer:
    """numba-cuda's MemoryPointer, as far as the lean path cares."""

    def __init__(self, context, pointer, size, owner=None, finalizer=None):
        self.context = context
        self.device_pointer = pointer
        self.size = size
        self._cuda_memsize_ = size
        self.is_managed = finalizer is not None
        self.refct = 1
        self.handle = self.device_pointer
        self._owner = owner


def construct_with(cls):
    return lambda pointer, size: cls(CONTEXT, pointer, size)


def test_a_plain_constructor_is_reproduced_exactly():
    make = lean_maker(construct_with(PlainMemoryPointer), Pointer)
    assert make is not None
    pointer, owner = Pointer(0x1000), object()
    lean = make(pointer, 4096, owner)
    normal = PlainMemoryPointer(CONTEXT, pointer, 4096)
    normal._rrmm_allocation = owner
    assert type(lean) is PlainMemoryPointer
    assert lean.__dict__ == normal.__dict__
    assert lean.device_pointer is lean.handle is pointer
    assert lean.size == lean._cuda_memsize_ == 4096
    assert lean._rrmm_allocation is owner
    other = make(Pointer(0x2000), 8, None)
    assert other.__dict__ is not lean.__dict__ and lean.size == 4096  # no shared state


class DerivedValue(PlainMemoryPointer):
    def __init__(self, context, pointer, size):
        super().__init__(context, pointer, size)
        self.end = pointer.address + size  # depends on the arguments: not reproducible


class FreshObjectPerInstance(PlainMemoryPointer):
    def __init__(self, context, pointer, size):
        super().__init__(context, pointer, size)
        self.views = []  # would be shared by every copy of the template


class Slotted:
    __slots__ = ("device_pointer", "size")

    def __init__(self, context, pointer, size):
        self.device_pointer = pointer
        self.size = size


class CustomNew(PlainMemoryPointer):
    def __new__(cls, *args):
        return super().__new__(cls)


class KeepsNoPointer(PlainMemoryPointer):
    def __init__(self, context, pointer, size):
        super().__init__(context, Pointer(pointer.address), size)


def test_anything_not_shown_to_be_the_same_falls_back():
    for cls in (DerivedValue, FreshObjectPerInstance, Slotted, CustomNew, KeepsNoPointer):
        assert lean_maker(construct_with(cls), Pointer) is None, cls.__name__


def test_a_constructor_that_raises_falls_back():
    def construct(pointer, size):
        raise TypeError("no context argument")

    assert lean_maker(construct, Pointer) is None
