"""Building a framework's small Python objects without running their constructor.

The Numba hook returns one ``MemoryPointer`` per allocation, and its constructor (a Python
frame storing a handful of attributes) costs about as much as the allocation itself. When the
constructor does nothing but store attributes, an object built by copying a template's
attribute dict and filling in the pointer and the size is the same object, for less.
``lean_maker`` checks that on a probe, attribute by attribute, and gives up (returns None)
whenever it cannot show it, so a framework release that changes the constructor costs speed,
never correctness.
"""

PROBE_ADDRESS = 0x7F0000001000
PROBE_SIZE = 0x5A300


def lean_maker(construct, pointer_of):
    """A function ``make(pointer, size, owner)`` that returns what ``construct(pointer, size)``
    returns, with ``_rrmm_allocation = owner`` added, without calling the constructor; or None.

    ``construct(pointer, size)`` builds the object the normal way; ``pointer_of(address)`` makes
    the pointer object ``construct`` expects. The lean path is used only when the class is a
    plain Python class (no ``__slots__``, ``object.__new__``), the constructor stores the
    pointer (by identity) under one or two attributes and the size under one or two, and a
    probe built the lean way has exactly the attributes, and the same objects in them, as one
    built by ``construct``.
    """
    try:
        template = construct(pointer_of(0), 0)
        state = dict(template.__dict__)
        probe_pointer = pointer_of(PROBE_ADDRESS)
        expected = dict(construct(probe_pointer, PROBE_SIZE).__dict__)
    except (AttributeError, TypeError, ValueError):
        return None
    cls = type(template)
    if cls.__new__ is not object.__new__ or hasattr(cls, "__slots__"):
        return None
    pointer_keys = tuple(k for k, v in expected.items() if v is probe_pointer)
    size_keys = tuple(k for k, v in expected.items() if type(v) is int and v == PROBE_SIZE)
    if not 0 < len(pointer_keys) <= 2 or not 0 < len(size_keys) <= 2:
        return None
    if set(expected) != set(state):
        return None
    # Two keys each (numba-cuda stores the pointer as `device_pointer` and `handle`, the size
    # as `size` and `_cuda_memsize_`); a single key is written twice.
    p1, p2 = (pointer_keys * 2)[:2]
    s1, s2 = (size_keys * 2)[:2]
    new = object.__new__

    def make(pointer, size, owner):
        attrs = state.copy()
        attrs[p1] = attrs[p2] = pointer
        attrs[s1] = attrs[s2] = size
        attrs["_rrmm_allocation"] = owner
        obj = new(cls)
        obj.__dict__ = attrs
        return obj

    probe = make(probe_pointer, PROBE_SIZE, None).__dict__
    expected["_rrmm_allocation"] = None
    if probe.keys() != expected.keys() or any(probe[k] is not expected[k] for k in expected):
        return None
    return make
