"""Memory resources under RMM's ``rmm.pylibrmm.memory_resource`` path (the same as ``rrmm.mr``)."""

from rrmm.mr import *
from rrmm.mr import __all__  # noqa: F401
