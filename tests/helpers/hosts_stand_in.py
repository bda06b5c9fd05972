"""The multi-host methods (broadcast_from_chief, gather, to_host) of the mirrored and mesh runtimes on 2
logical CPUs, with the runtime told it is one of 2 hosts (chief or not), so the collective code path runs
instead of the one-host shortcut. Prints one RESULT line of JSON."""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402

from harness.config import RuntimeConfig  # noqa: E402
from harness.runtime import make_runtime  # noqa: E402
from harness.runtime.base import InputContext  # noqa: E402


def as_host(rt, host: int):
    """The same runtime object, reporting `host` of 2 (the class is swapped for a subclass)."""
    cls = type(rt)
    rt.__class__ = type(f"{cls.__name__}AsHost{host}", (cls,), {
        "num_hosts": property(lambda self: 2), "host_id": property(lambda self, h=host: h)})
    return rt


def exercise(rt) -> dict:
    out = {"replicas": rt.num_replicas}

    # gather and to_host do not depend on the host count (replica order across hosts is the strategy's /
    # the mesh's own); they run here on the real one-host runtime.
    def dataset_fn(ctx: InputContext) -> tf.data.Dataset:
        return tf.data.Dataset.range(8).map(lambda i: {"x": tf.cast(i, tf.float32)}).batch(ctx.batch_size)

    batch = next(iter(rt.distribute_dataset(dataset_fn, 8, 0)))
    gathered = rt.function(lambda b: rt.gather(rt.run(lambda e: {"y": e["x"] * 2.0}, (b,))))(batch)
    out["gathered"] = rt.to_host(gathered["y"]).tolist()

    value = np.array([0.75, 1.0])
    as_host(rt, 0)
    out["chief_broadcast"] = rt.broadcast_from_chief(value).tolist()
    as_host(rt, 1)
    # A non-chief's own value never wins: only the chief's contribution survives the sum.
    out["other_broadcast"] = rt.broadcast_from_chief(np.array([9.0, 9.0])).tolist()
    return out


def main() -> None:
    result = {}
    for name, cfg in (("mirrored", RuntimeConfig(kind="mirrored", cpu_devices=2)),
                      ("mesh", RuntimeConfig(kind="mesh", cpu_devices=2, mesh={"data": 2, "model": 1},
                                           jit_compile=True))):
        result[name] = exercise(make_runtime(cfg))
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
