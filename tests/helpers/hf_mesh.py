"""A Hugging Face checkpoint loaded onto a 2 x 2 mesh of logical CPUs, with FSDP (tests/test_hf_mesh.py).

argv: case name (tests/test_hf_golden.py CASES), then overrides. Builds the case's workload on the mesh with
`model.init_checkpoint` at its golden checkpoint and prints one RESULT line of JSON: for every layout variable,
whether its value assembled from the devices' shards equals the layout's own transform of the checkpoint
tensors, and the shapes each device holds; the size of every read the load made of each tensor; and the
logits and loss the mesh computes on the golden inputs.
"""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from tensorflow.experimental import dtensor  # noqa: E402

from harness.nn import hf_checkpoint  # noqa: E402
from harness.train.workload import split_loss  # noqa: E402
from tests.test_hf_golden import CASES, GOLDEN, build  # noqa: E402

MESH = ["runtime.kind=mesh", "runtime.cpu_devices=4", "runtime.mesh={data: 2, model: 2}", "runtime.fsdp=true"]


def main(case: str, overrides: list[str]) -> None:
    workload, case_overrides = CASES[case]
    path = os.path.join(GOLDEN, case)
    reads: dict[str, list[int]] = {}   # tensor -> elements of each read during the load
    read_block = hf_checkpoint.Checkpoint.read_block
    read = hf_checkpoint.Checkpoint.read

    def counted_block(self, name, index):
        out = read_block(self, name, index)
        reads.setdefault(name, []).append(int(out.size))
        return out

    def counted(self, name, rows=None):
        if rows is None:
            out = read(self, name)
            reads.setdefault(name, []).append(int(out.size))
            return out
        return read(self, name, rows)

    hf_checkpoint.Checkpoint.read_block, hf_checkpoint.Checkpoint.read = counted_block, counted
    wl = build(workload, case_overrides + [f"model.init_checkpoint={path}"] + MESH + overrides)
    hf_checkpoint.Checkpoint.read_block, hf_checkpoint.Checkpoint.read = read_block, read
    rt = wl.runtime
    ckpt = hf_checkpoint.Checkpoint(path)
    variables = {v.path: v.variable for v in rt.variables()}
    layout = wl.HF_FORMAT.layout(wl.cfg.model, set(ckpt.meta), lambda p: p in variables)
    equal, local = {}, {}
    for e in layout.entries:
        want = e.to_var(*[ckpt.read(p.name, p.rows) for p in e.parts]).astype(np.float32)
        equal[e.path] = bool(np.array_equal(hf_checkpoint.host_value(variables[e.path]), want))
        value = variables[e.path].read_value()
        local[e.path] = [list(t.shape) for t in dtensor.unpack(value)] if dtensor.is_dtensor(value) else None
    golden = load_file(os.path.join(path, "golden.safetensors"))
    tokens = rt.to_mesh(golden["tokens"], dtensor.Layout.batch_sharded(rt.mesh, rt.batch_dim, 2))

    def forward(t):
        hidden, _ = wl.model(t[:, :-1])
        logits = wl.model.logits(hidden)
        terms = split_loss(wl.loss({"tokens": t}, tf.constant([0, 0])))[0]
        loss = tf.add_n([x.total / (x.count + x.epsilon) for x in terms.values()])
        return dtensor.relayout(logits, dtensor.Layout.replicated(rt.mesh, 3)), loss

    logits, loss = rt.function(forward)(tokens)
    print("RESULT " + json.dumps({"equal": equal, "local": local, "reads": reads, "logits": rt.to_host(logits).tolist(),
                                  "loss": float(rt.to_host(loss))}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
