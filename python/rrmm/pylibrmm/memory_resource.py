"""Memory resources under RMM's ``rmm.pylibrmm.memory_resource`` path (the same as ``rrmm.mr``)."""

from rrmm.mr import *  # noqa: F403
from rrmm.mr import __all__  # noqa: F401
