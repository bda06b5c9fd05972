"""Running a helper script that traces DTensor programs on logical CPU devices and prints one RESULT line, with
DTensor's SPMD-expanded modules (the program each device runs) dumped to a directory: the dump is a VLOG-gated
MLIR dump that TensorFlow reads from the environment at start-up, so it needs a fresh process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_spmd_helper(helper: str, dump: str, *args: str, passes: str = "DTensorSPMDExpansion",
                    timeout: int = 900) -> dict:
    """The JSON of `helper dump *args`'s last RESULT line (the helper run from the repository root)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CPP_VMODULE="dtensor_mlir_passes=1",
               TF_DUMP_GRAPH_PREFIX=dump, MLIR_BRIDGE_LOG_PASS_FILTER=passes)
    p = subprocess.run([sys.executable, helper, dump, *args], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=timeout)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert p.returncode == 0 and line, p.stdout[-2000:] + p.stderr[-4000:]
    return json.loads(line[-1][len("RESULT "):])
