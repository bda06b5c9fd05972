"""`run CONFIG` for several configs in one process (one TensorFlow start for all), each through the CLI's own
dispatch: what `mlperf-harness run CONFIG [ARG ...] --output_dir OUT/<n>` does, one after another.

    python tests/helpers/shipped_runs.py CPU_DEVICES OUT_DIR CONFIG [CONFIG ...]
    python tests/helpers/shipped_runs.py CPU_DEVICES OUT_DIR -- CONFIG [ARG ...] -- CONFIG [ARG ...]

(the second form gives each run its own arguments, e.g. --set; a shipped config runs with none).

CPU_DEVICES logical CPUs are set before TensorFlow starts, so the configs that share a process are those
whose runtime wants that many (a mesh or mirrored config) or one device (the default runtime, which takes
the first). Prints `RESULT <config> {"code": exit code, "out": its output dir, ...}` per config (a run that
raises prints a FAILED line instead; the others still run).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv: list[str]) -> None:
    devices, out_dir = int(argv[0]), argv[1]
    if argv[2:3] == ["--"]:
        runs = [run.split("\0") for run in "\0".join(argv[3:]).split("\0--\0")]
    else:
        runs = [[config] for config in argv[2:]]
    from absl import flags

    from harness import cli
    from harness.runtime.distribute import configure_logical_cpus

    if devices > 1:
        configure_logical_cpus(devices)
    for n, (config, *args) in enumerate(runs):
        out = os.path.join(out_dir, str(n))
        stdout, stderr = io.StringIO(), io.StringIO()
        start = time.time()
        flags.FLAGS.unparse_flags()  # every flag back to its default, as in a fresh process
        try:
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                code = cli.dispatch(flags.FLAGS(["mlperf-harness", "run", config, *args, "--output_dir", out]))
        except BaseException:  # noqa: BLE001 - reported, and the next config still runs
            print(f"FAILED {config} {json.dumps(traceback.format_exc())}", flush=True)
            continue
        result = {"code": code, "out": out, "seconds": round(time.time() - start, 1),
                  "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}
        print(f"RESULT {config} {json.dumps(result)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
