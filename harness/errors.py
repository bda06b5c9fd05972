"""User-facing errors: one clear line and exit code 2, never a traceback wall; and the faults that become
such a line: an output directory checked before the work that writes there, an `OSError`, TensorFlow's op
error reduced to the line that says what went wrong.
"""
from __future__ import annotations

import os
import re


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


# Lines of a TensorFlow op error that say where it happened, not what: the wrapper's first line, the node it
# was detected at and the Python frames that built it, the ops it ran in.
_NOISE = re.compile(r"^(Graph execution error:?|Detected at node .*|<stack traces unavailable>|\[\[.*\]\].*|"
                    r".*\(most recent call last\):?)$")
_PREFIX = re.compile(r"^(\{\{function_node [^}]*\}\}\s*)+")
_SUFFIX = re.compile(r"(\s*\[Op:[^\]]*\])?( name:\s*\S*)?$")
# "Error in user-defined function passed to <op> transformation with iterator: Iterator::...::Map: <what>"
_DATASET_FN = re.compile(r"^Error in user-defined function passed to .*? transformation with iterator: "
                         r"Iterator::\S*?: ")


def op_error_line(text: str) -> str:
    """The first line of a TensorFlow op error's message that says what went wrong ("" if none does): past
    "Graph execution error:", node and stack-frame lines, without the dataset transformation and op names
    around it. A record's bytes quoted by the Example parser are cut (they are binary)."""
    for raw in text.splitlines():
        line = _PREFIX.sub("", raw.strip())
        if not line or _NOISE.match(line) or raw.startswith((" ", "\t")):  # indented: a frame or its code
            continue
        line = _SUFFIX.sub("", _DATASET_FN.sub("", line)).strip()
        if "Could not parse example input" in line:
            return "a record is not a tf.train.Example (Could not parse example input)"
        if line.startswith("corrupted record at"):
            line += " (a TFRecord's bytes do not match their checksum)"
        if line:
            return line[:300]
    return ""
