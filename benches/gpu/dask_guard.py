"""What the Dask benches share (``dask_share.py``, ``shared_gpu_dask.py``): one run in a fresh
ledger directory, under a watchdog."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def guarded_run(
    label: str, seconds: float, prefix: str, unset: tuple[str, ...] = ()
) -> Iterator[list[int]]:
    """A fresh ``RRMM_LEDGER_DIR`` (the workers' processes inherit it; the variables in
    ``unset`` are removed meanwhile) and a watchdog: past ``seconds`` it kills the pids put in
    the list it yields (the workers, their nannies) and ends this process (exit status 124).
    The environment is restored and the directory removed after."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    saved = {k: os.environ.get(k) for k in ("RRMM_LEDGER_DIR", *unset)}
    ledger = os.path.join(tmp, "ledger")
    os.mkdir(ledger, 0o700)
    os.environ["RRMM_LEDGER_DIR"] = ledger
    for k in unset:
        os.environ.pop(k, None)
    pids: list[int] = []

    def overrun() -> None:
        print(f"{label}: over {seconds} s; ending the workers", flush=True)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(124)

    watchdog = threading.Timer(seconds, overrun)
    watchdog.daemon = True
    watchdog.start()
    try:
        yield pids
    finally:
        watchdog.cancel()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)
