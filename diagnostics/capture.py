"""Captures what child processes (the C compiler Triton runs for its launcher, ptxas) print.

Triton builds its launcher with ``subprocess.check_call(cc_cmd, stdout=DEVNULL)`` (upstream) or
prints ``Failed to compile. cc_cmd: ...`` and re-raises (triton-windows): the compiler's own lines
(``fatal error C1083: Cannot open include file: 'Python.h'``, ``error: include file 'Python.h' not
found``) go straight to the process' stdout/stderr file descriptors, and the exception keeps only
``CalledProcessError: ... returned non-zero exit status 1``. ``native_output`` points descriptors 1
and 2 at a temporary file for the duration of a block, so children inherit it, then restores them,
echoes what was captured to the real stderr (the user still sees it) and keeps the text for the
triage. Where the descriptors can't be redirected (no console, e.g. pythonw) it captures nothing."""
from __future__ import annotations

import locale
import os
import sys
import tempfile
from contextlib import contextmanager

LIMIT = 256 * 1024  # keep the last 256 KiB: compiler errors come last


class Captured:
    def __init__(self) -> None:
        self.text = ""
        self.echoed = False


def _echo(data: bytes) -> bool:
    """Writes ``data`` to the (restored) stderr; False where there is none to write to."""
    try:
        os.write(2, data)
    except OSError:
        return False
    return True


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:  # MSVC and Windows tools print in the console's code page
        return data.decode(locale.getpreferredencoding(False) or "latin-1", errors="replace")


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError, AttributeError):
            continue


@contextmanager
def native_output(cap: Captured | None = None, echo: bool = True):
    """Redirects file descriptors 1 and 2 into a temporary file inside the block; ``cap.text``
    holds what was written there (by this process or its children) once the block is left,
    also when it raised."""
    cap = cap if cap is not None else Captured()
    _flush()
    try:
        saved = (os.dup(1), os.dup(2))
    except OSError:
        yield cap
        return
    tmp = tempfile.TemporaryFile(prefix="tritonkit-native-")
    try:
        os.dup2(tmp.fileno(), 1)
        os.dup2(tmp.fileno(), 2)
        try:
            yield cap
        finally:
            _flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            tmp.seek(0, os.SEEK_END)
            size = tmp.tell()
            tmp.seek(max(0, size - LIMIT))
            data = tmp.read()
            cap.text = _decode(data)
            cap.echoed = bool(echo and data and _echo(data))
    finally:
        for fd in saved:
            os.close(fd)
        tmp.close()
