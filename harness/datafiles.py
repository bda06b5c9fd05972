"""Finding a workload's data files, with the clear errors every file-based source needs."""
from __future__ import annotations

import os

import tensorflow as tf

from harness.errors import HarnessError


def list_files(data_dir: str, pattern: str, what: str) -> list[str]:
    """Sorted files matching `pattern` under `data_dir`; `what` names the data in the error messages."""
    if not data_dir:
        raise HarnessError(f"data.source=tfrecord needs data.data_dir (the folder of {what})")
    if not os.path.isdir(data_dir):
        raise HarnessError(f"data.data_dir {data_dir} does not exist")
    files = sorted(tf.io.gfile.glob(os.path.join(data_dir, pattern)))
    if not files:
        raise HarnessError(f"no files match {os.path.join(data_dir, pattern)}")
    return files
