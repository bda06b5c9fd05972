"""The per-device program DTensor builds for one train step of each named mesh config, as JSON.

Run in a subprocess (tests/test_mesh_split.py): the 4 logical CPU devices are set before TensorFlow
starts, and DTensor writes its SPMD-expanded MLIR module (the program each device runs, with local
shapes and the collectives it inserted) only when these variables are in the environment at start-up:
TF_CPP_VMODULE=dtensor_mlir_passes=1, TF_DUMP_GRAPH_PREFIX=<dir>, MLIR_BRIDGE_LOG_PASS_FILTER=
DTensorSPMDExpansion (a VLOG-gated dump in TF 2.21's dtensor_mlir_passes.cc).

argv: dump dir, JSON {name: [config, [overrides]]}, traced in order. A name ending in `:blocks` is traced with
the decoders' cross-entropy in 4 recomputed blocks instead of one kept block. A name ending in `:mutant` is traced
after gpt_oss's attention output projection is made to gather its operands to full heads first, and the
loss's vocab-split LM head to gather its kernel whole (replicated compute, the losses unchanged: the bugs
the test must catch); the patches stay for later cases.

Prints one RESULT line: {name: {"contractions": [...], "all_gathers": [...], "lookups": [...],
"segment_sums": [...], "results": [every result shape, once], "vocab": V, "hidden": m}}, every shape as
"AxB" local to one device.
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

from harness.nn import cross_entropy  # noqa: E402
from harness.train import loop  # noqa: E402
from tests.helpers.step_case import build  # noqa: E402

# Device groups of a 2x2 mesh {data: 2, model: 2} (device = 2 * data index + model index).
AXES = {"[[0, 1], [2, 3]]": "model", "[[0, 2], [1, 3]]": "data", "[[0, 1, 2, 3]]": "all"}
LOSS_DEFAULTS = (cross_entropy.KEEP_ELEMENTS, cross_entropy.BLOCK_ELEMENTS)
CONTRACTIONS = ("Einsum", "MatMul", "BatchMatMulV2")
OP = re.compile(r'^\s*(%[\w#]+)(?::\d+)? = "tf\.(\w+)"\(([^)]*)\)(.*)$')
CONST = re.compile(r'^\s*(%[\w#]+) = "tf\.Const"\(\) <\{value = dense<(.*?)> : tensor<')


def replicate_attention_output() -> None:
    """The mutant: ctx and the output kernel laid out with heads whole before `bshgd,hgdm->bsm`."""
    from benchmarks.lm import attention as gpt

    original = gpt.Attention.__call__

    def call(self, x, segments):
        real_einsum = tf.einsum

        def einsum(equation, *operands):
            if equation == "bshgd,hgdm->bsm":
                ctx, wo = operands
                operands = (self.runtime.place(ctx, ("batch", None, None, None, None)),
                            self.runtime.place(wo, (None, None, None, None)))
            return real_einsum(equation, *operands)

        gpt.tf.einsum = einsum
        try:
            return original(self, x, segments)
        finally:
            gpt.tf.einsum = real_einsum

    gpt.Attention.__call__ = call


def gather_output_layer(runtime) -> None:
    """The mutant's loss: the vocab-split LM head gathered whole before its matmul (every device computes
    every logit: a [tokens, full vocab] buffer, the same losses)."""
    class EinsumGathersHead:
        def __getattr__(self, name):
            return getattr(tf, name)

        @staticmethod
        def einsum(equation, *operands):
            if equation == "bcm,mkr->bckr":
                x, w3 = operands
                operands = (x, runtime.place(w3, (None, None, None)))
            return tf.einsum(equation, *operands)

    cross_entropy.tf = EinsumGathersHead()


def shapes(types: str) -> list[str]:
    """Shapes of the tensor types in an MLIR type list ("tensor<2x3xf32>, tensor<i32>" -> ["2x3", ""])."""
    return [m.group(1).rstrip("x") for m in re.finditer(r"tensor<((?:\d+x)*)\w+>", types)]


def parse(text: str) -> dict:
    consts = {m.group(1): m.group(2) for m in map(CONST.match, text.splitlines()) if m}
    ops = []
    for line in text.splitlines():
        m = OP.match(line)
        if not m:
            continue
        name, op, args, rest = m.groups()
        sig = re.search(r":\s*\((.*)\)\s*->\s*(.*)$", rest)
        ins, outs = (shapes(sig.group(1)), shapes(sig.group(2))) if sig else ([], [])
        equation = re.search(r'equation = "([^"]*)"', rest)
        reduce_op = re.search(r'reduce_op = "(\w+)"', rest)
        ops.append(dict(name=name, op=op, args=[a.strip() for a in args.split(",") if a.strip()], ins=ins,
                        outs=outs, equation=equation.group(1) if equation else op,
                        reduce_op=reduce_op.group(1) if reduce_op else ""))
    users: dict[str, list[dict]] = {}
    for o in ops:
        for a in o["args"]:
            users.setdefault(a.split(":")[0], []).append(o)

    def collectives(o: dict) -> list[str]:
        out = []
        for u in users.get(o["name"], []):
            if u["op"].startswith("DTensor"):
                groups = consts.get(u["args"][1], "") if len(u["args"]) > 1 else ""
                out.append(" ".join(x for x in (u["op"], u["reduce_op"], AXES.get(groups, groups)) if x))
        return out

    return {
        "contractions": [dict(equation=o["equation"], operands=o["ins"], result=o["outs"][0],
                              collectives=collectives(o)) for o in ops if o["op"] in CONTRACTIONS],
        "all_gathers": sorted(f"{o['ins'][0]}->{o['outs'][0]}" for o in ops if o["op"] == "DTensorAllGather"),
        "lookups": [dict(params=o["ins"][0], result=o["outs"][0]) for o in ops
                    if o["op"] in ("GatherV2", "ResourceGather")],
        "results": sorted({r for o in ops for r in o["outs"]}),
        "segment_sums": [o["outs"][0] for o in ops if ("Segment" in o["op"] or "Scatter" in o["op"])
                         and not o["op"].startswith("DTensor")],
    }


def main(dump: str, cases: dict[str, list]) -> None:
    out = {}
    for name, (config, overrides) in cases.items():
        if name.endswith(":mutant"):
            replicate_attention_output()
        before = set(glob.glob(os.path.join(dump, "*")))
        cross_entropy.KEEP_ELEMENTS, cross_entropy.BLOCK_ELEMENTS = LOSS_DEFAULTS
        if name.endswith(":blocks"):  # the loss in 4 recomputed blocks (1 row x 32 positions x 40 ids each)
            cross_entropy.KEEP_ELEMENTS, cross_entropy.BLOCK_ELEMENTS = 0, 32 * 40
        cfg, rt, wl = build(config, overrides)
        if name.endswith(":mutant"):
            gather_output_layer(rt)
        steps = loop.CompiledSteps(rt, wl)
        it = iter(loop.train_input(rt, wl, cfg.schedule.global_batch_size, cfg.seed))
        steps.train_loop(it, tf.constant(1))
        new = sorted(set(glob.glob(os.path.join(dump, "*after_DTensorSPMDExpansion*__train_loop*"))) - before)
        if len(new) != 1:
            raise SystemExit(f"{name}: expected one SPMD-expanded train_loop module in {dump}, found {new}")
        with open(new[0]) as f:
            out[name] = parse(f.read())
        table = next(v.variable for v in rt.variables() if v.dims[:1] == ("vocab",))
        out[name]["vocab"], out[name]["hidden"] = table.shape.as_list()
    print("RESULT " + json.dumps(out), flush=True)
    # Several meshes in one process: TensorFlow's teardown can abort after the result is out.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
