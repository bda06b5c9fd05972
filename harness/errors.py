"""User-facing errors: one clear line and exit code 2, never a traceback wall; and the filesystem faults
that become such a line (an output directory checked before the work that writes there).
"""
from __future__ import annotations

import os


class HarnessError(Exception):
    """Bad input or environment the user can fix (config, data path, devices, TPU address).

    The CLI prints ``error: <message>`` and exits with code 2. Raise it with a message that names the
    problem and, where possible, the fix.
    """

    exit_code = 2


BAD_DATA_MARK = "bad input data:"
"""First item of an input pipeline's in-graph assertion (tf.debugging.Assert data) about a corrupt record
that validation could not reach: the run turns the op error into one `error:` line of the rest."""



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
