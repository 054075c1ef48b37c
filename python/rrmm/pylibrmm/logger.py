"""RMM's ``rmm.pylibrmm.logger``: the logging level API and ``level_enum``, defined in
``rrmm._logging`` and re-exported here whole."""

from rrmm import _logging
from rrmm._logging import *

__all__ = _logging.__all__
