"""Checks `mlperf-harness plan` against public MLPerf results: for every family of one system at 3 or more
scales (mlperf-scale-families-v0.7-v1.0.csv in --data DIR, built from the public v0.7/v1.0 result logs),
calibrate on the SMALLEST scale only (its logged step time, and its eval time split by the stated rule of
harness/plan/project.py; asynchronous evals as such), project the other scales with their logged global
batch, and compare with the logged olympic time to train. Nothing here is fitted to the points it is judged
on: the larger scales only enter as the actual values, and the systems' fixed per-step costs come from the
HELD_OUT rows below (`--derive_overheads`). The output gives the error per point, per workload and by
scale ratio (projected chips / calibration chips), and the points closest to the 1.5x limit.

Fixed choices, stated once: the model cost is the analytic count of the workload's reference config
(benchmarks/<name>/cost.py); gradients are all-reduced in 16 bits (NVIDIA's v0.7 logs: fp16 all-reduce,
`--allreduce_post_accumulation_fp16`; TPUs in bf16); epochs to converge come from the 1.0.0 RCP tables
(the first round with RCPs; the v0.7 results predate them, and v0.7 BERT's target 0.712 is easier than
1.0's 0.720) and, for the Transformer, from the documented table in benchmarks/transformer/cost.py, built
from public results outside these families. NVIDIA's Transformer batch is in tokens: rows = tokens / 256.

v0.7 BERT is the exception on both counts, for reasons stated in its own logs (the run_pretraining.py command
line and the hyperparameters each result_*.txt of mlcommons/training_results_v0.7 starts with):
- its target (0.712) is not the RCPs' (0.720), so the samples to converge are the calibration runs' logged
  samples scaled by the learning-rate schedule each run sets itself (`opt_learning_rate_training_steps` x
  global batch; harness.plan.converge.by_schedule);
- NVIDIA's runs all-reduce after the backward pass (`--allreduce_post_accumulation`: no overlap) and only
  its 1- and 2-node runs drop the padding tokens (`--unpad`); the step of a padded run is the unpadded
  step's compute x the padding factor derived, like the fixed costs, from held-out rows: NVIDIA's DGX-2H
  BERT at 1 node (unpadded) and 32 nodes (padded), the same code and data on another system.

The current round's LLM rows, apart (their own summary; the tables above keep theirs): the MLPerf Training
v5.0 llama2_70b_lora results (scripts/data/mlperf-llm-v5.0.csv, built by scripts/build_v5_llm_table.py from
github.com/mlcommons/training_results_v5.0; v5.0 has no llama31_8b), families of one submitter's system at
two or more scales (V5_FAMILIES). Each is calibrated on its smallest scale (its step and its eval) and its
larger ones projected at their logged global batch, samples to converge from the 5.0.0 RCP table. Each
point's replica spans tensor x context parallelism as its public config file names it (V5_LAYOUTS, from
`<submitter>/benchmarks/llama2_70b_lora/implementations/.../config_<system>_<nodes>x<gpus>x<minibs>x
tp<T>pp1cp<C>.sh`; where none is published, the smallest axis that leaves a whole number of rows per
replica, as context parallelism): the plan's model axis of T x C chips, with the workload's activation
all-reduces where T > 1 and none for context parallelism alone (ring attention passes K and V around the
ring under the attention's own compute). The base is frozen and no submitter shards it over data
parallelism (runtime.fsdp off), so only the adapters' gradients are reduced. They train in FP8 (`FP8=True` in
the NeMo and AMD configs), so the systems' fp8 peaks are the ones divided by (plan --precision fp8).

    python scripts/validate_plan.py [--data DIR] [--csv OUT] [--derive_overheads]
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from harness.config import load_config  # noqa: E402
from harness.errors import HarnessError  # noqa: E402
from harness.plan import converge, cost as costs  # noqa: E402
from harness.plan.project import calibrate, project, solve_efficiency, step_time  # noqa: E402
from harness.plan.system import load_system  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(os.path.dirname(os.path.dirname(REPO)), "shared", "data")
SYSTEMS = {"tpu-v4": "tpu-v4", "tpu-v3": "tpu-v3", "dgxa100": "dgx-a100", "dgx2h": "dgx-2h", "C4140": "dell-c4140",
           "dgxh100": "dgx-h100"}
RCP_RULESET = "1.0.0"
GRADIENT_BYTES_PER_PARAM = 2.0
TOKENS_PER_ROW = 256
# the eval cadence of the round's rules (BERT 0.7.0: from 3M samples every 500K; SSD: 40, 50, 55, ...)
ROUND_RULESETS = {"v0.7": "0.7.0", "v1.0": "1.0.0"}
# the tables' eval_mode: timed synchronous evals, asynchronous ones (training goes on inside the interval);
# "start/stop stamped together" and "none logged" time nothing
EVAL_MODES = {"sync": "sync", "async": "async"}


# Fixed per-step costs (the systems' step_overhead_seconds) come from public results OUTSIDE the validated
# families: one system at two per-chip batches, one framework, one round. At one efficiency the step model
# reproduces both steps only with one fixed cost; `--derive_overheads` prints it. (round, submitter,
# benchmark, system file, [(chips, logged global batch, system name)] x 2)
HELD_OUT = [("v1.0", "NVIDIA", "resnet", "dgx-a100", [(8, 3264, "dgxa100_ngc21.05_mxnet"),
                                                      (64, 13056, "dgxa100_n8_ngc21.05_mxnet")]),
            ("v0.7", "NVIDIA", "resnet", "dgx-2h", [(16, 3328, "dgx2h_ngc20.06_mxnet"),
                                                    (512, 33280, "dgx2h_n32_ngc20.06_mxnet")]),
            ("v1.0", "Google", "ssd", "tpu-v4", [(64, 1024, "tpu-v4-128-TF"), (2048, 2048, "tpu-v4-4096-TF")]),
            ("v0.7", "Google", "resnet", "tpu-v3", [(16, 4096, "tpu-v3-32-TF2.0"), (4096, 65536, "tpu-v3-8192-TF")])]


# What the v0.7 BERT submissions ran, from their logs: the learning-rate schedule's length in steps
# (`opt_learning_rate_training_steps`, the same in every result_*.txt of a system) and, for NVIDIA's
# run_pretraining.py, whether `--unpad` was on. (round, submitter, benchmark, system) -> value
SCHEDULE_STEPS = {("v0.7", "NVIDIA", "bert", "dgxa100_ngc20.06_pytorch"): 13700,
                  ("v0.7", "NVIDIA", "bert", "dgxa100_n2_ngc20.06_pytorch"): 8103,
                  ("v0.7", "NVIDIA", "bert", "dgxa100_n32_ngc20.06_pytorch"): 990,
                  ("v0.7", "Google", "bert", "tpu-v4-16-TF"): 13700,
                  ("v0.7", "Google", "bert", "tpu-v4-128-TF"): 1141,
                  ("v0.7", "Google", "bert", "tpu-v4-512-TF"): 1141}
UNPAD = {("v0.7", "NVIDIA", "bert", "dgxa100_ngc20.06_pytorch"): True,
         ("v0.7", "NVIDIA", "bert", "dgxa100_n2_ngc20.06_pytorch"): True,
         ("v0.7", "NVIDIA", "bert", "dgxa100_n32_ngc20.06_pytorch"): False,
         ("v0.7", "NVIDIA", "bert", "dgx2h_ngc20.06_pytorch"): True,
         ("v0.7", "NVIDIA", "bert", "dgx2h_n32_ngc20.06_pytorch"): False}
# all-reduce after the backward pass, not under it (--allreduce_post_accumulation in every one of these runs)
POST_BACKWARD_ALLREDUCE = {("v0.7", "NVIDIA", "bert")}
# The padding factor's held-out pair: one system, one code, one round, unpadded then padded (not a family
# scored here: two scales). (round, submitter, benchmark, system file, [(chips, global batch, system name)] x 2)
HELD_OUT_PADDING = ("v0.7", "NVIDIA", "bert", "dgx-2h", [(16, 432, "dgx2h_ngc20.06_pytorch"),
                                                         (512, 9216, "dgx2h_n32_ngc20.06_pytorch")])


# The real-token cost (plan --real_token_fraction) on a pair outside the families (two scales only, not
# scored in the median): NVIDIA's v1.0 DGX A100 BERT, which skips padding in every run (--unpad --unpad_fmha
# and --allreduce_post_accumulation on the command line of each result_*.txt), calibrated at 1 node with the
# MLPerf data's fraction and projected at 8. (round, submitter, benchmark, system file, [(chips, global
# batch, system name)] x 2)
REAL_TOKENS = ("v1.0", "NVIDIA", "bert", "dgx-a100", [(8, 448, "dgxa100_ngc21.05_pytorch"),
                                                      (64, 3072, "dgxa100_n8_ngc21.05_pytorch")])


V5_TABLE = os.path.join(REPO, "scripts", "data", "mlperf-llm-v5.0.csv")
V5_RULESET = "5.0.0"
# (submitter, system file, [system names of the table, one family]): one submitter's systems of one chip and
# software at two or more scales
V5_FAMILIES = [
    ("NVIDIA", "gb200-nvl72", ["tyche_ngpu8_ngc25.04_nemo", "tyche_ngpu72_ngc25.04_nemo",
                               "tyche_ngpu144_ngc25.04_nemo", "tyche_ngpu512_ngc25.04_nemo"]),
    ("Oracle", "gb200-nvl72", ["1xBM.GPU.GB200.4", "2xBM.GPU.GB200.4", "18xBM.GPU.GB200.4"]),
    ("Oracle", "b200", ["1xBM.GPU.B200.8", "8xBM.GPU.B200.8"]),
    ("Oracle", "h200", ["1xBM.GPU.H200.8", "64xBM.GPU.H200.8"]),
    ("HPE", "h200", ["HPE-Cray-XD670-H200-SXM5-141GB_n1_24.09", "HPE-Cray-XD670-H200-SXM5-141GB_n2_24.09",
                     "HPE-Cray-XD670-H200-SXM5-141GB_n4_24.09"]),
    ("MangoBoost", "mi300x", ["MI300X-LLMBoost-GPUBoost-1node", "MI300X-LLMBoost-GPUBoost-2node",
                              "MI300X-LLMBoost-GPUBoost-4node"]),
]


# The current round's fixed per-step costs (the systems' step_overhead_seconds) come, as HELD_OUT's, from pairs
# of one system at two scales that are not scored: (submitter, system file, [system names] x 2). The MI300X
# has no such pair (MangoBoost's is its only family): its cost is not sourced.
V5_HELD_OUT = [("Dell", "gb200-nvl72", ["4xXE9712x4GB200", "16xXE9712x4GB200"]),
               ("Supermicro", "b200", ["AS-4126GS-NBR-LCC_N1", "AS-4126GS-NBR-LCC_N2"]),
               ("Dell", "h200", ["1xXE9680Lx8H200-SXM-141GB", "2xXE9680Lx8H200-SXM-141GB"])]
# (tensor, context) parallelism of each system's runs, from its public config file's name (module docstring)
V5_LAYOUTS = {"tyche_ngpu8_ngc25.04_nemo": (1, 1), "tyche_ngpu72_ngc25.04_nemo": (1, 8),
              "tyche_ngpu144_ngc25.04_nemo": (1, 8), "tyche_ngpu512_ngc25.04_nemo": (1, 8),
              "1xBM.GPU.GB200.4": (1, 2), "2xBM.GPU.GB200.4": (1, 1), "18xBM.GPU.GB200.4": (1, 8),
              "1xBM.GPU.B200.8": (1, 1), "8xBM.GPU.B200.8": (1, 8),
              "1xBM.GPU.H200.8": (4, 1), "64xBM.GPU.H200.8": (4, 2),
              "HPE-Cray-XD670-H200-SXM5-141GB_n1_24.09": (2, 1), "HPE-Cray-XD670-H200-SXM5-141GB_n2_24.09": (4, 2),
              "HPE-Cray-XD670-H200-SXM5-141GB_n4_24.09": (2, 1), "1xXE9680Lx8H200-SXM-141GB": (1, 2),
              "MI300X-LLMBoost-GPUBoost-1node": (1, 1), "MI300X-LLMBoost-GPUBoost-2node": (1, 2),
              "MI300X-LLMBoost-GPUBoost-4node": (1, 4)}


def v5_layout(system: str, chips: int, batch: int) -> tuple[int, int]:
    """(tensor, context) parallelism of a v5.0 point: its config's, else context parallelism alone."""
    return V5_LAYOUTS.get(system) or (1, model_axis_for(chips, batch))


def model_axis_for(chips: int, batch: int) -> int:
    """The smallest model axis that leaves a whole number of rows per data-parallel replica."""
    return next(m for m in range(1, chips + 1) if chips % m == 0 and batch % (chips // m) == 0)


def v5_rows(path: str = V5_TABLE) -> dict:
    with open(path) as f:
        return {(r["submitter"], r["system"]): r for r in csv.DictReader(f)}


def v5_config():
    return load_config(os.path.join(REPO, "configs", "llama2_70b_lora", "reference.yaml"),
                       [f"ruleset={V5_RULESET}", "runtime.fsdp=false"])


def v5_point(cost, row: dict) -> tuple[int, int, float, int, object]:
    """(chips, global batch, step seconds, model axis, cost) of a v5.0 row laid out as its config names."""
    tp, cp = v5_layout(row["system"], int(row["chips"]), int(row["global_batch"]))
    return (int(row["chips"]), int(row["global_batch"]), float(row["step_seconds"]), tp * cp,
            dataclasses.replace(cost, mp_bytes_per_sample=cost.mp_bytes_per_sample if tp > 1 else 0.0))


def v5_system(name: str):
    """The system file at its fp8 peak (the v5.0 LLM runs train in FP8)."""
    system = load_system(name)
    return dataclasses.replace(system, peak_flops=system.peak("fp8"))


def v5_overheads() -> list[str]:
    """The fixed per-step costs V5_HELD_OUT gives (the lines to print)."""
    rows, cost = v5_rows(), costs.analytic(v5_config())
    out = []
    for submitter, system_name, (a, b) in V5_HELD_OUT:
        pa, pb = v5_point(cost, rows[(submitter, a)]), v5_point(cost, rows[(submitter, b)])
        fixed, eff = derive_overhead(pa[4], v5_system(system_name), pa[:3], pb[:3], pa[3], pb[3], pb[4])
        out.append(f"  {system_name:<12} {fixed * 1e3:7.2f} ms (efficiency {eff:.2f}) from v5.0 {submitter} "
                   f"llama2_70b_lora: {pa[0]} chips x {pa[1] / pa[0]:g}/chip {pa[2] * 1e3:.1f} ms (model axis "
                   f"{pa[3]}), {pb[0]} x {pb[1] / pb[0]:g}/chip {pb[2] * 1e3:.1f} ms (model axis {pb[3]})")
    return out


def validate_v5(path: str = V5_TABLE) -> tuple[list[dict], list[str]]:
    """The v5.0 LLM families (module docstring), as `validate` returns its points."""
    rows = v5_rows(path)
    cfg = v5_config()
    module = costs.workload_cost_model(cfg.workload)
    cost = costs.analytic(cfg)
    results, skipped = [], []
    for submitter, system_name, names in V5_FAMILIES:
        pts = [rows.get((submitter, n)) for n in names]
        if any(r is None for r in pts):
            skipped.append(f"v5.0 {submitter} {system_name}: rows missing from {path}")
            continue
        system = v5_system(system_name)
        pts = sorted(pts, key=lambda r: int(r["chips"]))
        base = pts[0]
        n0, b0, _, m0, cost0 = v5_point(cost, base)
        cal = calibrate(cost0, system, n0, b0, float(base["step_seconds"]), float(base["eval_seconds"]), "sync",
                        float(base["evals_per_run"]), float(base["mean_samples"]) / b0, m0)
        name = f"v5.0 {submitter} {system_name} llama2_70b_lora"
        for p in pts[1:]:
            n, b = int(p["chips"]), int(p["global_batch"])
            m, p_cost = v5_point(cost, p)[3:]
            conv = converge.to_converge(cfg.workload, V5_RULESET, b, module.converge_unit, None)
            conv = converge.at_evals(conv, module.eval_positions(cfg, conv.value, b))
            proj = project(p_cost, system, conv, n, b, cal.efficiency, m, cal)
            actual = float(p["olympic_minutes"])
            step_s = float(p["step_seconds"])
            results.append(dict(family=name, system=system_name, calib_chips=n0, efficiency=cal.efficiency,
                                scale_ratio=n / n0, eval_share=proj.eval_total_seconds / proj.total_seconds,
                                chips=n, batch=b, per_chip=b / n, model_axis=m, predicted_min=proj.total_seconds / 60,
                                actual_min=actual, ratio=proj.total_seconds / 60 / actual,
                                predicted_converge=conv.stop, actual_converge=float(p["mean_samples"]),
                                converge_in_range=conv.in_range, predicted_step_ms=proj.step.total * 1e3,
                                actual_step_ms=step_s * 1e3, step_ratio=proj.step.total / step_s,
                                converge_ratio=(conv.stop or conv.value) / float(p["mean_samples"]),
                                by_schedule=False, padding_factor=1.0))
    return results, skipped


def print_v5(results: list[dict], skipped: list[str]) -> bool:
    """The v5.0 LLM rows and their own summary; whether they meet their goal (median <= 10%, none > 1.5x)."""
    print("the current round: MLPerf Training v5.0 llama2_70b_lora, each family calibrated on its smallest scale:")
    print(f"  {'family':<42} {'cal@':>5} {'eff':>5} {'chips':>6} {'batch':>5} {'axis':>4} {'pred min':>9} "
          f"{'actual':>8} {'pred/act':>8} {'conv pred':>9} {'conv act':>9} {'step pred':>9} {'step act':>8}")
    for r in results:
        print(f"  {r['family']:<42} {r['calib_chips']:>5} {r['efficiency']:>5.2f} {r['chips']:>6} {r['batch']:>5} "
              f"{r['model_axis']:>4} {r['predicted_min']:>9.3f} {r['actual_min']:>8.3f} {r['ratio']:>8.2f} "
              f"{r['predicted_converge']:>9,.0f} {r['actual_converge']:>9,.0f} {r['predicted_step_ms']:>9.1f} "
              f"{r['actual_step_ms']:>8.1f}")
    for s_ in skipped:
        print(f"  skipped: {s_}")
    if not results:
        return False
    errors = [abs(r["ratio"] - 1) for r in results]
    worst = max(results, key=lambda r: max(r["ratio"], 1 / r["ratio"]))
    factor = max(worst["ratio"], 1 / worst["ratio"])
    steps = [abs(r["step_ratio"] - 1) for r in results]
    convs = [abs(r["converge_ratio"] - 1) for r in results]
    print(f"  v5.0 points: {len(results)} in {len({r['family'] for r in results})} families; median |error| "
          f"{100 * statistics.median(errors):.1f}%; worst {worst['family']} at {worst['chips']} chips: "
          f"predicted/actual {worst['ratio']:.2f} ({factor:.2f}x off); step alone median "
          f"{100 * statistics.median(steps):.1f}%, samples to converge alone {100 * statistics.median(convs):.1f}%")
    met = statistics.median(errors) <= 0.10 and factor <= 1.5
    print(f"  v5.0 goal (median |error| within 10%, none off by more than 1.5x): {'MET' if met else 'NOT MET'}")
    return met


def derive_overhead(cost, system, a: tuple[int, int, float], b: tuple[int, int, float], axis_a: int = 1,
                    axis_b: int = 1, cost_b=None) -> tuple[float, float]:
    """(fixed seconds per step, efficiency) with which the step model gives both (chips, batch, step
    seconds) points (each at its model axis; `cost_b` the second's when it differs): bisection on the fixed
    cost, the efficiency solved from the first point each time."""
    def miss(fixed: float) -> tuple[float, float]:
        sysm = dataclasses.replace(system, step_overhead_seconds=fixed)
        eff = solve_efficiency(cost, sysm, a[0], a[1], a[2], axis_a)
        return step_time(cost_b or cost, sysm, b[0], b[1], eff, axis_b).total - b[2], eff

    lo, hi = 0.0, min(a[2], b[2]) * 0.999
    if miss(lo)[0] >= 0:
        return 0.0, miss(lo)[1]
    for _ in range(60):
        mid = (lo + hi) / 2
        try:
            m = miss(mid)[0]
        except HarnessError:
            hi = mid
            continue
        lo, hi = (mid, hi) if m < 0 else (lo, mid)
    return lo, miss(lo)[1]


def derive_padding(cost, system, a: tuple[int, int, float], b: tuple[int, int, float]) -> tuple[float, float]:
    """(padding factor, efficiency): the efficiency solved from the unpadded point `a`, then the factor on
    the train FLOPs per sample with which the step model gives the padded point `b` (bisection)."""
    eff = solve_efficiency(cost, system, a[0], a[1], a[2])

    def step(factor: float) -> float:
        padded = dataclasses.replace(cost, train_flops_per_sample=cost.train_flops_per_sample * factor)
        return step_time(padded, system, b[0], b[1], eff).total

    lo, hi = 0.25, 8.0
    if not step(lo) <= b[2] <= step(hi):
        raise HarnessError(f"padding factor: the padded step {b[2] * 1e3:.1f} ms is out of reach")
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if step(mid) < b[2] else (lo, mid)
    return lo, eff


def bert_cost(rnd: str):
    cfg = load_config(os.path.join(REPO, "configs", "bert", "reference.yaml"), [f"ruleset={ROUND_RULESETS[rnd]}"])
    cost = costs.analytic(cfg)
    return dataclasses.replace(cost, gradient_bytes=GRADIENT_BYTES_PER_PARAM * cost.params)


def scale_row(rows: list[dict], rnd: str, submitter: str, bench: str, n: int, batch: int,
              sysname: str) -> dict | None:
    """The scale table's row of one submitter's system at n accelerators and global batch `batch`."""
    for r in rows:
        if ((r["round"], r["submitter"], r["benchmark"], r["system"]) == (rnd, submitter, bench, sysname)
                and int(r["num_accelerators"]) == n and int(r["global_batch_size"]) == batch):
            return r
    return None


def held_out_padding(data_dir: str) -> tuple[float, str]:
    """The padding factor from HELD_OUT_PADDING and how it was found."""
    rnd, submitter, bench, system_name, pts = HELD_OUT_PADDING
    rows = scale_rows(data_dir)
    found = []
    for n, batch, sysname in pts:
        r = scale_row(rows, rnd, submitter, bench, n, batch, sysname)
        if r is None:
            raise HarnessError(f"padding factor: no {rnd} {submitter} {bench} row for {sysname}")
        found.append((n, batch, float(r["mean_step_ms"]) / 1e3))
    system = load_system(system_name)
    if (rnd, submitter, bench) in POST_BACKWARD_ALLREDUCE:
        system = dataclasses.replace(system, allreduce_overlap=0.0)
    factor, eff = derive_padding(bert_cost(rnd), system, found[0], found[1])
    kinds = ["unpadded" if UNPAD[(rnd, submitter, bench, s)] else "padded" for _, _, s in pts]
    how = (f"{system_name:<9} padded/unpadded compute {factor:.3f} (efficiency {eff:.2f}) from {rnd} {submitter} "
           f"{bench}: " + ", ".join(f"{n} chips x {b / n:g}/chip {t * 1e3:.1f} ms {kind}"
                                    for (n, b, t), kind in zip(found, kinds)))
    return factor, how


def real_token_check(data_dir: str) -> list[str]:
    """REAL_TOKENS calibrated at its first scale, padded and at the data's real-token fraction, projected at
    its second: the lines to print."""
    rnd, submitter, bench, system_name, pts = REAL_TOKENS
    rows = scale_rows(data_dir)
    found = []
    for n, batch, sysname in pts:
        r = scale_row(rows, rnd, submitter, bench, n, batch, sysname)
        if r is None:
            return [f"  {rnd} {submitter} {bench}: no row for {sysname}"]
        found.append((n, batch, float(r["mean_step_ms"]) / 1e3, float(r["olympic_score_minutes"]),
                      float(r["epochs_or_samples_to_converge"])))
    cfg = load_config(os.path.join(REPO, "configs", bench, "reference.yaml"), [f"ruleset={ROUND_RULESETS[rnd]}"])
    module = costs.workload_cost_model(bench)
    system = dataclasses.replace(load_system(system_name), allreduce_overlap=0.0)
    (n0, b0, step0, _, _), (n1, b1, step1, minutes1, conv1) = found
    lines = [f"  {rnd} {submitter} {system_name} {bench}, unpadded, calibrated at {n0} chips x {b0 / n0:g} "
             f"({step0 * 1e3:.1f} ms), projected at {n1} x {b1 / n1:g} ({step1 * 1e3:.1f} ms, {minutes1:.3f} min):"]
    for fraction in (None, module.dataset_real_tokens[1]):
        cost = costs.with_real_tokens(cfg, module, fraction)
        cost = dataclasses.replace(cost, gradient_bytes=GRADIENT_BYTES_PER_PARAM * cost.params)
        label = "padded cost" if fraction is None else f"--real_token_fraction {fraction:g}"
        try:
            cal = calibrate(cost, system, n0, b0, step0)
        except HarnessError as e:
            lines.append(f"    {label:<28} {e}")
            continue
        conv = converge.to_converge(cfg.workload, RCP_RULESET, b1, module.converge_unit, None)
        conv = converge.at_evals(conv, module.eval_positions(cfg, conv.value, b1))
        proj = project(cost, system, conv, n1, b1, cal.efficiency, 1, cal)
        lines.append(f"    {label:<28} efficiency {cal.efficiency:.2f}: step {proj.step.total * 1e3:.1f} ms "
                     f"(projected/logged {proj.step.total / step1:.2f}), {proj.total_seconds / 60:.3f} min "
                     f"({proj.total_seconds / 60 / minutes1:.2f}; samples {conv.stop or conv.value:,.0f} vs "
                     f"{conv1:,.0f} logged), MFU {100 * proj.mfu:.0f}%")
    return lines


def held_out_overheads(data_dir: str) -> list[str]:
    rows = scale_rows(data_dir)
    lines = []
    for rnd, submitter, bench, system_name, pts in HELD_OUT:
        cfg = load_config(os.path.join(REPO, "configs", bench, "reference.yaml"), [f"ruleset={ROUND_RULESETS[rnd]}"])
        cost = costs.analytic(cfg)
        cost = dataclasses.replace(cost, gradient_bytes=GRADIENT_BYTES_PER_PARAM * cost.params)
        system = dataclasses.replace(load_system(system_name), step_overhead_seconds=0.0)
        found = []
        for n, batch, sysname in pts:
            r = [r for r in rows
                 if (r["round"], r["submitter"], r["benchmark"], r["system"]) == (rnd, submitter, bench, sysname)
                 and int(r["num_accelerators"]) == n and int(r["global_batch_size"]) == batch]
            found.append((n, batch, float(r[0]["mean_step_ms"]) / 1e3) if r else None)
        if None in found:
            lines.append(f"  {system_name}: {rnd} {submitter} {bench}: rows not found")
            continue
        fixed, eff = derive_overhead(cost, system, found[0], found[1])
        lines.append(f"  {system_name:<9} {fixed * 1e3:5.2f} ms per step (efficiency {eff:.2f}) from {rnd} "
                     f"{submitter} {bench}: "
                     + ", ".join(f"{n} chips x {b / n:g}/chip {t * 1e3:.2f} ms" for n, b, t in found))
    return lines


def family_rows(data_dir: str) -> list[dict]:
    with open(os.path.join(data_dir, "mlperf-scale-families-v0.7-v1.0.csv")) as f:
        return list(csv.DictReader(f))


def scale_rows(data_dir: str) -> list[dict]:
    with open(os.path.join(data_dir, "mlperf-scale-v0.7-v1.0.csv")) as f:
        return list(csv.DictReader(f))


def num(x: str) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


@dataclasses.dataclass
class Point:
    chips: int
    batch: int            # in the plan's unit (rows for the Transformer)
    logged_batch: int
    minutes: float
    converge: float
    step_ms: float | None
    epoch_s: float | None
    eval_s: float | None
    eval_mode: str        # "sync" | "async" | "untimed"
    evals: float
    system: str = ""      # the row's system name (the submission's)


def points_of(family: dict, rows: list[dict]) -> list[Point]:
    accs = [int(a) for a in family["accelerators"].split()]
    batches = [int(b) for b in family["global_batch_sizes"].split()]
    out = []
    for n, b in zip(accs, batches):
        match = [r for r in rows if r["round"] == family["round"] and r["submitter"] == family["submitter"]
                 and r["benchmark"] == family["benchmark"] and family["hardware"] in r["system"]
                 and int(r["num_accelerators"]) == n and int(r["global_batch_size"]) == b]
        if not match:
            continue
        r = match[0]
        rows_batch = b // TOKENS_PER_ROW if family["benchmark"] == "transformer" and b > 65536 // 8 else b
        out.append(Point(n, rows_batch, b, float(r["olympic_score_minutes"]), float(r["epochs_or_samples_to_converge"]),
                         num(r["mean_step_ms"]), num(r["mean_time_per_epoch_seconds"]), num(r["mean_eval_seconds"]),
                         EVAL_MODES.get(r["eval_mode"].split(" ")[0], "untimed"), num(r["eval_count"]) or 0.0,
                         r["system"]))
    return out


def validate(data_dir: str) -> tuple[list[dict], list[str]]:
    rows = scale_rows(data_dir)
    results, skipped = [], []
    padding, _ = held_out_padding(data_dir)
    configs = {(w, rnd): load_config(os.path.join(REPO, "configs", w, "reference.yaml"), [f"ruleset={rs}"])
               for w in ("resnet", "bert", "ssd", "transformer") for rnd, rs in ROUND_RULESETS.items()
               if w != "transformer" or rnd == "v0.7"}
    for fam in family_rows(data_dir):
        name = f"{fam['round']} {fam['submitter']} {fam['hardware']} {fam['benchmark']}"
        system_name = SYSTEMS.get(fam["hardware"])
        if system_name is None:
            skipped.append(f"{name}: no system file for {fam['hardware']}")
            continue
        system = load_system(system_name)
        if (fam["round"], fam["submitter"], fam["benchmark"]) in POST_BACKWARD_ALLREDUCE:
            system = dataclasses.replace(system, allreduce_overlap=0.0)
        cfg = configs[(fam["benchmark"], fam["round"])]
        module = costs.workload_cost_model(cfg.workload)
        cost = costs.analytic(cfg)
        cost = dataclasses.replace(cost, gradient_bytes=GRADIENT_BYTES_PER_PARAM * cost.params)
        pts = sorted(points_of(fam, rows), key=lambda p: p.chips)
        if len(pts) < 3:
            skipped.append(f"{name}: fewer than 3 scales readable")
            continue
        base = pts[0]
        if base.step_ms:
            step = base.step_ms / 1e3
        elif base.epoch_s:
            step = base.epoch_s / (cost.train_samples / base.batch)
        else:
            skipped.append(f"{name}: no step or epoch time at the smallest scale")
            continue
        steps = cost.train_samples / base.batch * base.converge if module.converge_unit == "epochs" else \
            base.converge / base.batch
        try:
            cal = calibrate(cost, system, base.chips, base.batch, step, base.eval_s if base.eval_mode != "untimed"
                            else None, base.eval_mode, base.evals, steps)
        except HarnessError as e:
            skipped.append(f"{name}: {e}")
            continue
        eff = cal.efficiency
        ruleset = RCP_RULESET if converge.has_rcps(cfg.workload, RCP_RULESET) else cfg.ruleset
        def schedule(pt: Point) -> float | None:
            steps_ = SCHEDULE_STEPS.get((fam["round"], fam["submitter"], fam["benchmark"], pt.system))
            return steps_ * pt.batch if steps_ else None

        def unpadded(pt: Point) -> bool | None:
            return UNPAD.get((fam["round"], fam["submitter"], fam["benchmark"], pt.system))

        for p in pts[1:]:
            if schedule(base) and schedule(p):
                conv = converge.by_schedule(base.converge, schedule(base), schedule(p), module.converge_unit)
            else:
                conv = converge.to_converge(cfg.workload, ruleset, p.batch, module.converge_unit,
                                            module.convergence)
            conv = converge.at_evals(conv, module.eval_positions(cfg, conv.value, p.batch))
            factor = 1.0
            if unpadded(base) is not None and unpadded(p) is not None and unpadded(base) != unpadded(p):
                factor = padding if unpadded(base) else 1 / padding
            p_cost = dataclasses.replace(cost, train_flops_per_sample=cost.train_flops_per_sample * factor)
            proj = project(p_cost, system, conv, p.chips, p.batch, eff, 1, cal)
            pred = proj.total_seconds / 60
            pred_step = step_time(p_cost, system, p.chips, p.batch, eff).total * 1e3
            results.append(dict(family=name, system=system_name, calib_chips=base.chips, efficiency=eff,
                                scale_ratio=p.chips / base.chips,
                                eval_share=proj.eval_total_seconds / proj.total_seconds,
                                chips=p.chips, batch=p.logged_batch, per_chip=p.batch / p.chips, predicted_min=pred,
                                actual_min=p.minutes,
                                ratio=pred / p.minutes, predicted_converge=conv.stop, actual_converge=p.converge,
                                converge_in_range=conv.in_range, predicted_step_ms=pred_step, actual_step_ms=p.step_ms,
                                step_ratio=pred_step / p.step_ms if p.step_ms else None,
                                converge_ratio=(conv.stop or conv.value) / p.converge,
                                by_schedule=bool(schedule(base) and schedule(p)), padding_factor=factor))
    return results, skipped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=DATA, help="folder of the public scale tables")
    ap.add_argument("--csv", default=None, help="also write the per-point table here")
    ap.add_argument("--derive_overheads", action="store_true",
                    help="print the systems' fixed per-step costs derived from the held-out rows, and stop")
    args = ap.parse_args()
    if not os.path.isdir(args.data):
        print(f"error: no public tables at {args.data} (give --data DIR)", file=sys.stderr)
        return 2
    try:
        if args.derive_overheads:
            print("fixed per-step cost from public results outside the validated families:")
            print("\n".join(held_out_overheads(args.data)))
            print("\n".join(v5_overheads()))
            print("padding factor (a padded run's compute over an unpadded one's, same code) from held-out rows:")
            print(f"  {held_out_padding(args.data)[1]}")
            return 0
        results, skipped = validate(args.data)
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{'family':<34} {'cal@':>5} {'eff':>5} {'ratio':>5} {'chips':>6} {'batch':>7} {'/chip':>6} "
          f"{'pred min':>9} {'actual':>8} "
          f"{'pred/act':>8} {'conv pred':>10} {'conv act':>10} {'step pred':>9} {'step act':>8} {'eval%':>5}")
    for r in results:
        def c(x: float) -> str:
            return f"{x:,.0f}" if x > 1000 else f"{x:.1f}"
        step_act = f"{r['actual_step_ms']:.1f}" if r["actual_step_ms"] else "-"
        print(f"{r['family']:<34} {r['calib_chips']:>5} {r['efficiency']:>5.2f} {r['scale_ratio']:>5.0f} "
              f"{r['chips']:>6} {r['batch']:>7} "
              f"{r['per_chip']:>6.3g} "
              f"{r['predicted_min']:>9.3f} {r['actual_min']:>8.3f} {r['ratio']:>8.2f} "
              f"{c(r['predicted_converge']) + ('' if r['converge_in_range'] else '*'):>10} "
              f"{c(r['actual_converge']):>10} "
              f"{r['predicted_step_ms']:>9.1f} {step_act:>8} {100 * r['eval_share']:>5.1f}")
    for s in skipped:
        print(f"skipped: {s}")
    if not results:
        print("error: no family could be projected", file=sys.stderr)
        return 2
    errors = [abs(r["ratio"] - 1) for r in results]
    worst = max(results, key=lambda r: max(r["ratio"], 1 / r["ratio"]))
    factor = max(worst["ratio"], 1 / worst["ratio"])
    print(f"points: {len(results)} in {len({r['family'] for r in results})} families; median |error| "
          f"{100 * statistics.median(errors):.1f}%; worst {worst['family']} at {worst['chips']} chips: "
          f"predicted/actual {worst['ratio']:.2f} ({factor:.2f}x off)")
    off = [r for r in results if max(r["ratio"], 1 / r["ratio"]) > 1.5]
    print(f"points off by more than 1.5x: {len(off)}" + "".join(
        f"\n  {r['family']} at {r['chips']} chips, {r['per_chip']:.3g} samples per chip: predicted/actual "
        f"{r['ratio']:.2f}, step {r['predicted_step_ms']:.1f} ms projected vs "
        f"{r['actual_step_ms'] or float('nan'):.1f} ms logged"
        for r in off))
    for fam_kind in ("resnet", "bert", "ssd", "transformer"):
        sub = [abs(r["ratio"] - 1) for r in results if r["family"].endswith(fam_kind)]
        if sub:
            print(f"  {fam_kind:<12} {len(sub)} points, median |error| {100 * statistics.median(sub):.1f}%, "
                  f"worst {100 * max(sub):.1f}%")
    print("the total's two factors, apart (the step as the tables log it: BERT's includes its untimed evals):")
    for label, key in (("step time", "step_ratio"), ("to converge", "converge_ratio")):
        sub = [r for r in results if r[key]]
        far = max(sub, key=lambda r: max(r[key], 1 / r[key]))
        median = 100 * statistics.median(abs(r[key] - 1) for r in sub)
        print(f"  {label:<12} {len(sub)} points, median |error| {median:.1f}%, "
              f"worst {far['family']} at {far['chips']} chips (projected/logged {far[key]:.2f})")
    for r in results:
        if r["by_schedule"] or r["padding_factor"] != 1.0:
            print(f"  {r['family']} at {r['chips']} chips: " + "; ".join(
                x for x in (("samples to converge by the learning-rate schedule (harness.plan.converge.by_schedule)"
                             if r["by_schedule"] else ""),
                            (f"compute x {r['padding_factor']:.3f} (padded run, unpadded calibration)"
                             if r["padding_factor"] != 1.0 else "")) if x))
    print("error by scale ratio (projected chips / calibration chips): how far one calibration carries")
    edges = [(1, 4), (4, 16), (16, 64), (64, 1 << 30)]
    for lo, hi in edges:
        sub = [r for r in results if lo < r["scale_ratio"] <= hi]
        if sub:
            errs = [abs(r["ratio"] - 1) for r in sub]
            far = max(sub, key=lambda r: max(r["ratio"], 1 / r["ratio"]))
            label = f"{lo}x-{hi}x" if hi < 1 << 30 else f"> {lo}x"
            print(f"  {label:<10} {len(sub):>3} points, median |error| {100 * statistics.median(errs):5.1f}%, worst "
                  f"{far['family']} at {far['chips']} chips (predicted/actual {far['ratio']:.2f})")
    near = sorted(results, key=lambda r: -max(r["ratio"], 1 / r["ratio"]))[:3]
    print("closest to the 1.5x limit: " + "; ".join(
        f"{r['family']} at {r['chips']} chips {r['ratio']:.2f} (converge {r['predicted_converge']:,.4g} "
        f"projected vs {r['actual_converge']:,.4g} logged, step "
        f"{r['predicted_step_ms']:.1f} ms vs {r['actual_step_ms'] or float('nan'):.1f} ms)" for r in near))
    print("real-token cost on logs that skip padding (two scales, reported apart, not in the median):")
    print("\n".join(real_token_check(args.data)))
    met = statistics.median(errors) <= 0.15 and factor <= 1.5
    print(f"goal (median |error| within 15%, none off by more than 1.5x): {'MET' if met else 'NOT MET'}")
    v5, v5_skipped = validate_v5()
    print_v5(v5, v5_skipped)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(results[0]))
            w.writeheader()
            w.writerows(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
