"""The smaller compiles that stand in for a model too big for this host, each in a Python process of its own
(or here), its model freed before the next is built."""
from __future__ import annotations

import contextlib
import gc
import os
from typing import Any

from harness import config as config_lib
from harness.dryrun.compile import compile_replica
from harness.dryrun.report import CompileReport
from harness.errors import HarnessError


@contextlib.contextmanager
def _model_freed_after() -> Any:
    """Frees what a compile built (weights, optimizer state) when it is done, before the next is built. A
    `tf.custom_gradient` traced in a graph (decoder remat's `tf.recompute_grad`, the MoE dispatch's gathers)
    registers its gradient function in TensorFlow's process-wide gradient registry under a fresh name and never
    removes it; the function's closure holds the layers, so every compiled model would stay in memory. The
    names this compile registered are dropped once its gradients are traced."""
    from tensorflow.python.framework.ops import gradient_registry as gradient_functions

    registered = gradient_functions._registry  # noqa: SLF001 - no public way to unregister
    before = set(registered)
    try:
        yield
    finally:
        for name in set(registered) - before:
            if name.startswith("CustomGradient-"):
                del registered[name]
        gc.collect()


def compile_here(config_path: str, overrides: list[str], optimize: bool, full: config_lib.Config) -> CompileReport:
    """One smaller compile standing in for `full`, in this process, its model freed when it is done."""
    with _model_freed_after():
        report = compile_replica(config_path, config_lib.load_config(config_path, overrides), optimize, full)
        report.traced = {}  # a traced step holds its model's variables
    return report


# Each small compile of a model too big for this host runs in a Python process of its own: what XLA and the
# allocators keep after a compile (several GB at full width) would otherwise add up over the compiles, and a
# process hands everything back when it ends. Tests that stand a fake in for `compile_here` set it False.
COMPILE_APART = True


def compile_small(config_path: str, overrides: list[str], optimize: bool, full: config_lib.Config) -> CompileReport:
    """One smaller compile standing in for `full`: in a process of its own (`COMPILE_APART`), else here."""
    return (_compile_apart if COMPILE_APART else compile_here)(config_path, overrides, optimize, full)


def _compile_apart(config_path: str, overrides: list[str], optimize: bool, full: config_lib.Config) -> CompileReport:
    """`compile_here` in a new Python process (arguments and report pickled through files); its HarnessError
    comes back as one; its console output is dropped unless it fails otherwise."""
    import pickle
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dryrun-") as tmp:
        args, out = os.path.join(tmp, "args.pkl"), os.path.join(tmp, "report.pkl")
        with open(args, "wb") as f:
            pickle.dump((config_path, overrides, optimize, full), f)
        code = "import sys; from harness.dryrun import apart; apart._compile_child(sys.argv[1], sys.argv[2])"
        proc = subprocess.run([sys.executable, "-c", code, args, out], capture_output=True, text=True,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")))
        if not os.path.exists(out):
            last = [line for line in proc.stderr.splitlines() if line.strip()][-1:] or ["no output"]
            killed = " (killed: out of host memory?)" if proc.returncode in (-9, 137) else ""
            raise HarnessError(f"the stood-in compile of {os.path.basename(config_path)} with {overrides} failed "
                               f"(exit {proc.returncode}{killed}): {last[0].strip()[:300]}")
        with open(out, "rb") as f:
            ok, value = pickle.load(f)
    if not ok:
        raise HarnessError(value)
    return value


def _compile_child(args: str, out: str) -> None:
    import pickle

    with open(args, "rb") as f:
        config_path, overrides, optimize, full = pickle.load(f)
    try:
        result = (True, compile_here(config_path, overrides, optimize, full))
    except HarnessError as e:
        result = (False, str(e))
    with open(out, "wb") as f:
        pickle.dump(result, f)
