"""The per-device program of one FSDP train step on a 2x2 {data, model} mesh, as JSON (tests/test_fsdp_split.py).

Run in a subprocess with the environment tests/test_mesh_split.py sets for DTensor's MLIR dumps, plus
MLIR_BRIDGE_LOG_PASS_FILTER naming DTensorSPMDExpansion and DTensorAllReduceScatterOptimization (the pass
that fuses an all-reduce followed by an all-scatter into one reduce-scatter). Reuses
tests/helpers/mesh_split.py's build and MLIR op pattern.

argv: dump dir, config, JSON list of overrides. Prints one RESULT line:
  {"weights": [[global shape, stored specs, compute specs], ...] (trainable variables FSDP splits),
   "gathers": [{"shape", "from", "to", "source"}] (every DTensorAllGather; source = the op it reads),
   "scatters": [{"shape", "from", "to", "reduced", "via"}] (every DTensorAllScatter; reduced = the
       collective found walking back through `via` (reshapes, identities), e.g. "DTensorAllReduce Add data"),
   "fused": {op: count} of the collectives after the fusion pass, "direct": scatters right after an all-reduce,
   "frozen": [[path, global shape, stored specs, compute specs], ...] (every non-trainable variable)}
"""
from __future__ import annotations

import glob
import json
import os
import re
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402
from tensorflow.experimental import dtensor  # noqa: E402

from harness.train import loop  # noqa: E402
from tests.helpers.mesh_split import AXES, CONST, OP, build  # noqa: E402

SPECS = re.compile(r"(input|output)_layout = #dtensor.layout<sharding_specs:([\w,]*)")
PASS_THROUGH = ("Identity", "Reshape", "DTensorLayout", "IdentityN")


def ops_of(text: str) -> tuple[dict[str, dict], dict[str, str]]:
    consts = {m.group(1): m.group(2) for m in map(CONST.match, text.splitlines()) if m}
    ops = {}
    for line in text.splitlines():
        m = OP.match(line)
        if m:
            name, op, args, rest = m.groups()
            layouts = {k: [x for x in v.split(",") if x] for k, v in SPECS.findall(rest)}
            sig = re.search(r":\s*\((.*)\)\s*->\s*(.*)$", rest)
            out = re.search(r"tensor<((?:\d+x)*)\w+>", sig.group(2)) if sig else None
            reduce_op = re.search(r'reduce_op = "(\w+)"', rest)
            ops[name] = dict(op=op, args=[a.strip().split(":")[0] for a in args.split(",") if a.strip()],
                             layouts=layouts, local=out.group(1).rstrip("x") if out else "",
                             reduce_op=reduce_op.group(1) if reduce_op else "")
    return ops, consts


def global_shape(local: str, specs: list[str], sizes: dict[str, int]) -> list[int]:
    return [int(d) * sizes.get(s, 1) for d, s in zip(local.split("x"), specs)]


def walk_back(ops: dict, consts: dict, name: str) -> tuple[dict | None, list[str], str]:
    """Follows single-input pass-through ops back from `name`: (the op reached, the ops passed, its label)."""
    via = []
    op = ops.get(name)
    while op and op["op"] in PASS_THROUGH:
        via.append(op["op"])
        op = ops.get(op["args"][0])
    if op is None:
        return None, via, "argument"
    label = op["op"]
    if op["op"].startswith("DTensor") and len(op["args"]) > 1:
        groups = consts.get(op["args"][1], "")
        label = " ".join(x for x in (op["op"], op["reduce_op"], AXES.get(groups, groups)) if x)
    return op, via, label


def main(dump: str, config: str, overrides: list[str]) -> None:
    cfg, rt, wl = build(config, overrides)
    steps = loop.CompiledSteps(rt, wl)
    steps.train_loop(iter(loop.train_input(rt, wl, cfg.schedule.global_batch_size, cfg.seed)), tf.constant(1))
    found = {p: glob.glob(os.path.join(dump, f"*after_{p}*__train_loop*"))
             for p in ("DTensorSPMDExpansion", "DTensorAllReduceScatterOptimization")}
    if any(len(v) != 1 for v in found.values()):
        raise SystemExit(f"expected one train_loop module per pass in {dump}, found {found}")
    with open(found["DTensorSPMDExpansion"][0]) as f:
        ops, consts = ops_of(f.read())
    gathers, scatters, direct = [], [], 0
    for op in ops.values():
        if op["op"] == "DTensorAllGather":
            source, _, label = walk_back(ops, consts, op["args"][0])
            gathers.append(dict(shape=global_shape(op["local"], op["layouts"]["output"], rt.sizes),
                                to=op["layouts"]["output"], source=label, **{"from": op["layouts"]["input"]}))
        elif op["op"] == "DTensorAllScatter":
            source, via, label = walk_back(ops, consts, op["args"][0])
            direct += not via and label.startswith("DTensorAllReduce")
            scatters.append(dict(shape=global_shape(op["local"], op["layouts"]["output"], rt.sizes),
                                 to=op["layouts"]["output"], reduced=label, via=via,
                                 **{"from": op["layouts"]["input"]}))
    with open(found["DTensorAllReduceScatterOptimization"][0]) as f:
        fused_ops, _ = ops_of(f.read())
    fused: dict[str, int] = {}
    for op in fused_ops.values():
        if op["op"].startswith("DTensor"):
            fused[op["op"]] = fused.get(op["op"], 0) + 1
    weights = []
    for v in rt.variables(trainable=True):
        stored = list(dtensor.fetch_layout(v.variable.read_value()).sharding_specs)
        compute = list(rt.layout_for(v.dims).sharding_specs)
        if stored != compute:
            weights.append([v.variable.shape.as_list(), stored, compute])
    frozen = []  # non-trainable variables (a fine-tune's frozen base, optimizer slots): path, shape, layouts
    for v in rt.variables(trainable=False):
        stored = list(dtensor.fetch_layout(v.variable.read_value()).sharding_specs)
        frozen.append([v.path, v.variable.shape.as_list(), stored, list(rt.layout_for(v.dims).sharding_specs)])
    print("RESULT " + json.dumps(dict(weights=weights, gathers=gathers, scatters=scatters, fused=fused,
                                      direct=direct, frozen=frozen)), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
