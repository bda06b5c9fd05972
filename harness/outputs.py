"""Where commands write: an output directory is checked before the work whose results would go there.

A run that finds its `output_dir` unusable after minutes of compiling, or a report that finds `--out` is a
file after reading every log, has lost that work; the check is cheap and says which path is wrong and why.
"""
from __future__ import annotations

import os

from harness.errors import HarnessError


def check_output_dir(path: str, name: str) -> str:
    """The absolute `path`, or one HarnessError when it cannot be (or become) a writable directory.

    `name` is how the user gave it (`--out`, `output_dir`). Nothing is created: the first existing
    ancestor must be a directory this process may write in.
    """
    full = os.path.abspath(path)
    probe = full
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        where = "is a file" if probe == full else f"cannot be made: {probe} is a file"
        raise HarnessError(f"{name} {path}: {where}, not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise HarnessError(f"{name} {path}: no permission to write in {probe}")
    return full


def describe_os_error(e: OSError) -> str:
    """One line for a filesystem error: what failed, on which path(s), without Python's repr."""
    reason = e.strerror or str(e)
    paths = " -> ".join(str(p) for p in (e.filename, e.filename2) if p is not None)
    return f"{reason}: {paths}" if paths else reason
