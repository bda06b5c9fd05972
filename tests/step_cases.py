"""The step cases (tests/helpers/step_case.py) that tests/test_workload_contract.py and
tests/test_xla_precision.py both read: each workload's model is built and stepped once per session, not
once per test file, and the workloads a session's selected tests need run together in one subprocess per
oneDNN mode (one TensorFlow start, not one per workload). tests/conftest.py tells `plan` which workloads
the collected tests read (their `step_cases` marks); a workload asked for outside that plan runs in a
process of its own. The first planned step case asked for starts every mode's process at once: they run
side by side (much of each is single-threaded tracing and compiling), the test waits for its own."""
from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
from typing import IO

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Per workload: a small variant of its smoke config. Eval sets of 45 do not divide the eval batch of 16
# (padding is masked); batch-norm statistics over the global batch make one device and two replicas
# compute the same function; dropout is off where each replica would draw its own masks.
SMALL = {
    # Two stages (the smoke's three less the last): a stride-1 and a stride-2 stage, each opening with a
    # projection shortcut (fewer ops to trace in each of the five step sets).
    "resnet": ["data.train_samples=256", "data.eval_samples=45", "schedule.global_batch_size=32",
               "schedule.eval_batch_size=16", "model.bn_span=32", "model.blocks=[1,1]"],
    "bert": ["data.train_samples=512", "data.eval_samples=45", "schedule.global_batch_size=16",
             "schedule.eval_batch_size=16", "model.num_layers=1"],
    # One layer at width 32 (2 heads) and rows of 16 tokens: the beam search decodes the eval set in each of
    # the five step sets.
    "transformer": ["data.synthetic_train_pairs=400", "data.eval_samples=45", "schedule.global_batch_size=8",
                    "schedule.eval_batch_size=16", "model.layer_postprocess_dropout=0",
                    "model.attention_dropout=0", "model.relu_dropout=0", "eval.extra_decode_length=4",
                    "model.num_layers=1", "model.hidden_size=32", "model.filter_size=64", "model.num_heads=2",
                    "data.max_sequence_length=16", "data.row_length=32"],
    # Rows of 256 tokens (the smoke's 8192 are for the logged runs). One layer, a windowed one (window 129 in
    # blocks of 64, its sinks and experts): the smoke's second, full-span layer runs the same blockwise kernel
    # with a span of 128, and every step set traced it again.
    "gpt_oss_20b": ["data.seq_length=256", "data.synthetic_train_rows=64", "data.eval_samples=45",
                    "schedule.global_batch_size=8", "schedule.eval_batch_size=16", "model.num_layers=1"],
    "llama31_8b": ["data.seq_length=64", "data.synthetic_train_rows=64", "data.eval_samples=45",
                   "schedule.global_batch_size=8", "schedule.eval_batch_size=16", "model.num_layers=1"],
    "deepseekv3_671b": ["data.seq_length=64", "data.synthetic_train_rows=64", "data.eval_samples=45",
                        "schedule.global_batch_size=8", "schedule.eval_batch_size=16", "model.num_layers=2",
                        "model.first_dense_layers=1"],
    # LoRA without its dropout (each replica would draw its own masks); the frozen base stays bf16.
    "llama2_70b_lora": ["data.seq_length=64", "data.synthetic_train_rows=64", "data.eval_samples=45",
                        "schedule.global_batch_size=8", "schedule.eval_batch_size=16", "model.num_layers=1",
                        "model.lora_dropout=0"],
    # flux1's draws are keyed by each sample's global position, so one device and two replicas draw the same
    # noise. Its reference order gives each replica a contiguous chunk of the set (32 of 64 rows here), so
    # which rows a global batch holds depends on the replica count: 4 synthetic captions (row content = row
    # mod 4) put the same content at every global position in both layouts.
    "flux1": ["data.synthetic_train_samples=64", "data.synthetic_classes=4", "data.eval_samples=45",
              "schedule.global_batch_size=8", "schedule.eval_batch_size=16"],
    # dlrmv4: every history full (N, the longest sequence per replica batch, is then the same on one device and
    # on each of two replicas) and no dropout (each replica would draw its own masks).
    "dlrmv4": ["data.synthetic_train_samples=64", "data.synthetic_eval_samples=45", "data.synthetic_min_history=8",
               "schedule.global_batch_size=8", "schedule.eval_batch_size=16", "model.num_layers=1",
               "model.input_dropout=0", "model.linear_dropout=0"],
    "ssd": ["data.train_samples=64", "data.eval_samples=45", "schedule.global_batch_size=16",
            "schedule.eval_batch_size=16", "model.bn_span=16"],
    # qwen35_397b_grpo: 2 groups of 16 rollouts of the initial policy (the same on one device and two replicas:
    # seeded weights and draws), repeated; an LR small enough that step 2's log-probs stay within seq-mask-tis's
    # bounds of the generator's, so the second loss follows the update. One gated attention + MoE layer: each
    # case builds the generator's XLA prefill too, and a Gated DeltaNet layer made the case 3 min of CPU.
    "qwen35_397b_grpo": ["data.eval_tasks=45", "schedule.global_batch_size=32", "schedule.eval_batch_size=16",
                         "grpo.generation_slots=32", "optimizer.base_learning_rate=0.00001", "model.num_layers=1",
                         "model.full_attention_interval=1"],
}
STEPS = 2

# The workloads whose one-device steps also run with oneDNN off (TensorFlow's default kernels). oneDNN replaces
# the kernels of convolutions, batch norm and pooling, of matmuls, batched matmuls and einsums, and of softmax,
# layer norm and the activations fused into them (grappler's oneDNN remapper); the gathers, scatters, top-k,
# NMS and control flow the other workloads add run the same kernels either way. resnet holds the conv, batch
# norm and pooling kinds (ssd's backbone is the same blocks), bert the dense encoder's (matmul, softmax, layer
# norm, gelu; transformer's and flux1's blocks are those ops), llama31_8b the decoder every LLM workload builds
# on (benchmarks/lm: batched-matmul attention with its rank-4 softmax, RMSNorm, SwiGLU). Every workload still
# runs with oneDNN on (step_case).
ONEDNN_OFF = ("bert", "llama31_8b", "resnet")

# The workloads whose steps also run in float16 (every workload runs bfloat16). The loss scaling, the skipped
# steps and the float32 master weights are the loop's (harness/train/loop.py, harness/nn/loss_scale.py), the
# same code for every workload; what float16 adds per workload is its ops in a narrow range: resnet's convolutions
# and batch norm (and its overflow case), transformer's own attention with its NEG_INF masks, llama2_70b_lora's
# frozen bfloat16 base under float16 compute on the LM decoder every LLM workload shares (benchmarks/lm), and
# flux1, whose workload casts its draws to the compute dtype itself.
FLOAT16 = ("flux1", "llama2_70b_lora", "resnet", "transformer")


_results: dict[str, dict[str, dict]] = {"1": {}, "0": {}}  # oneDNN mode -> workload -> RESULT (or error)
_planned: dict[str, set[str]] = {"1": set(), "0": set()}
_running: dict[str, tuple[list[str], subprocess.Popen, IO[str], IO[str]]] = {}  # mode -> started, unread


def plan(name: str, onednn: tuple[str, ...]) -> None:
    """A workload the session's tests will read in these oneDNN modes ("1" on, "0" off): the first step case
    asked for starts every planned workload of every mode (one process per mode)."""
    for mode in onednn:
        _planned[mode].add(name)


def _modes(name: str, onednn: str) -> list[str]:
    """What the helper runs besides the contract, XLA and bfloat16 steps (tests/helpers/step_case.py `case`)."""
    if onednn == "0":
        return ["plain"]
    return ["float16"] * (name in FLOAT16) + ["overflow"] * (name == "resnet")


def _start(names: list[str], onednn: str) -> None:
    helper = os.path.join(REPO, "tests", "helpers", "step_case.py")
    cases = {n: [os.path.join(REPO, "configs", n, "smoke.yaml"), SMALL[n], _modes(n, onednn)] for n in names}
    # Output to files, not pipes: nobody reads a process that runs ahead of the test waiting for it.
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    # XLA's CPU backend with LLVM's optimizations off: the HLO passes (fusion, simplification) that make XLA's
    # numbers differ from the plain steps' still run; optimizing the machine code only speeds up steps the
    # tests run twice (measured: the XLA steps' compile ~4 of resnet's and bert's ~60 CPU-s less).
    xla_flags = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
    proc = subprocess.Popen([sys.executable, helper, json.dumps(cases), str(STEPS)], cwd=REPO, stdout=out,
                            stderr=err, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS=onednn,
                                     XLA_FLAGS=xla_flags))
    _running[onednn] = (names, proc, out, err)


def _finish(onednn: str) -> None:
    names, proc, out, err = _running.pop(onednn)
    try:
        proc.wait(timeout=900 * len(names))  # generous: only a hang reaches it
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    out.seek(0)
    err.seek(0)
    stdout, stderr = out.read(), err.read()
    out.close()
    err.close()
    got = {}
    for line in stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind in ("RESULT", "FAILED"):
            name, _, payload = rest.partition(" ")
            got[name] = {"ok": kind == "RESULT", "value": json.loads(payload)}
    for n in names:
        _results[onednn][n] = got.get(n) or {
            "ok": False, "value": f"exit {proc.returncode}, no result for {n}:\n" + stdout[-2000:] + stderr[-4000:]}


@atexit.register
def _stop_unread() -> None:
    """A process no test waited for (its tests failed first or were interrupted) ends with the session."""
    for _, proc, _, _ in _running.values():
        proc.kill()
        proc.wait()


def _case(name: str, onednn: str) -> dict:
    done = _results[onednn]
    if name not in done:
        if name in _planned[onednn]:
            for mode in sorted(_planned, reverse=True):  # "1" first: most tests read it
                batch = sorted(_planned[mode] - set(_results[mode]))
                if batch and mode not in _running:
                    _start(batch, mode)
        if onednn in _running:
            _finish(onednn)
        if name not in done:  # asked for outside the plan
            _start([name], onednn)
            _finish(onednn)
    result = done[name]
    assert result["ok"], f"step case {name} (TF_ENABLE_ONEDNN_OPTS={onednn}) failed:\n{result['value']}"
    return result["value"]


def step_case(name: str) -> dict:
    """The helper's RESULT for workload `name` (asserting it ran cleanly), with oneDNN's kernels forced on:
    TensorFlow turns them on by itself only on some CPUs (AVX-512 ones), and some refuse shapes the default
    kernels take (a rank-6 softmax), so every machine that runs the suite runs them."""
    return _case(name, "1")


def step_case_onednn_off(name: str) -> dict:
    """One device's plain train steps and eval of `name` with oneDNN forced off (TensorFlow's default kernels,
    what AVX2-only CPUs run)."""
    return _case(name, "0")
