"""What a dry run found: `CompileReport`, one replica's compiled steps in numbers (FLOPs, parameters, bytes per
device, peaks, how each was obtained), printed as lines and written as JSON for `plan --model_cost`."""
from __future__ import annotations

import dataclasses
import time
from typing import Any


@dataclasses.dataclass
class CompileReport:
    workload: str            # registry name
    config: str              # config path
    replicas: int            # data-parallel replicas of the real run
    model_axis: int          # devices per replica (1 on tf.distribute runtimes)
    per_replica_batch: int   # training examples per replica per optimizer step
    global_batch: int
    eval_per_replica_batch: int
    params: int              # trainable parameters
    train_flops_per_replica_step: float  # one optimizer step of one replica (all of its devices)
    eval_flops_per_replica_step: float
    flops_source: str        # "xla cost analysis" or "counted (...)"
    weight_bytes_per_device: int
    optimizer_bytes_per_device: int
    gradient_bytes: int      # bytes a replica's step produces before reduction (its trainable params x grad dtype)
    peak_bytes_per_device: int | None  # XLA:CPU's plan (one device per replica), else the sum of the parts
    compile_seconds: dict[str, float]    # {"train": ..., "eval": ...}
    runtime_kind: str = ""
    precision: str = "float32"
    eval_peak_bytes_per_device: int | None = None
    gradient_bytes_per_device: int = 0   # each gradient split as its variable is
    activation_bytes_per_device: int | None = None  # estimate: see `memory_source`
    memory_source: str = ""  # how peak and activation bytes per device were obtained
    stand_in: list[str] = dataclasses.field(default_factory=list)  # what stood in for what, and how
    # runtime.fsdp: the data axis size, the per-device bytes of weights + optimizer state + gradients it
    # saves against the same mesh without FSDP, and the variable bytes it leaves whole over the data axis.
    fsdp_data_axis: int = 0
    fsdp_saved_bytes_per_device: int = 0
    fsdp_replicated_bytes: int = 0
    # The workload's useful FLOPs (benchmarks/<name>/cost.py) for the same per-replica batch: 0 = no cost model.
    useful_train_flops_per_replica_step: float = 0.0
    # Trainable parameters one replica's program holds: `params` but where the devices hold their own experts
    # only (an all-to-all dispatch, Workload.experts_stay_put); its gradients are `gradient_bytes`.
    replica_params: int = 0
    # The traced steps ({"train", "eval"} -> ConcreteFunction), for inspection; not part of to_dict().
    traced: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "traced"}

    def lines(self) -> list[str]:
        def gib(n: int | None) -> str:
            return "not reported" if n is None else f"{n / 2**30:.3f} GiB ({n:,} bytes)"

        how = "estimate" if self.memory_source.startswith("estimate") else "XLA:CPU buffer assignment"

        return [
            f"dry run: {self.workload} from {self.config} (XLA compile only: no data read, no log, no timing)",
            f"runtime: {self.runtime_kind}, {self.replicas} replica(s) x {self.model_axis} device(s) per replica, "
            f"precision {self.precision}",
            *(f"stood in: {s}" for s in self.stand_in),
            f"parameters: {self.params:,} trainable"
            + (f"; {self.replica_params:,} in one replica's program (its own experts)"
               if self.replica_params and self.replica_params != self.params else ""),
            f"batch: {self.per_replica_batch} per replica ({self.global_batch} global); eval "
            f"{self.eval_per_replica_batch} per replica",
            f"compile: train {self.compile_seconds['train']:.1f} s, eval {self.compile_seconds['eval']:.1f} s "
            f"(trace + XLA HLO passes on this CPU)",
            f"FLOPs per train step (one replica): {self.train_flops_per_replica_step:.4g}",
            f"FLOPs per eval step (one replica): {self.eval_flops_per_replica_step:.4g}",
            f"FLOPs source: {self.flops_source}",
            *([f"useful FLOPs per train step (one replica, the cost module's count): "
               f"{self.useful_train_flops_per_replica_step:.4g}; compiled / useful = "
               f"{self.train_flops_per_replica_step / self.useful_train_flops_per_replica_step:.2f}"]
              if self.useful_train_flops_per_replica_step else []),
            f"weights per device: {gib(self.weight_bytes_per_device)}",
            f"optimizer state per device: {gib(self.optimizer_bytes_per_device)}",
            f"gradients of one replica's step, before the cross-replica reduction: {gib(self.gradient_bytes)}",
            f"gradients per device: {gib(self.gradient_bytes_per_device)}",
            *([f"FSDP over data={self.fsdp_data_axis}: saves {gib(self.fsdp_saved_bytes_per_device)} per device "
               f"(weights, optimizer state and gradients) against no FSDP; "
               f"{gib(self.fsdp_replicated_bytes)} of variables stay whole over data (no dimension it divides)"]
              if self.fsdp_data_axis else []),
            f"activations and other temporaries per device (estimate, train step): "
            f"{gib(self.activation_bytes_per_device)}",
            f"peak memory per device ({how}, train step): {gib(self.peak_bytes_per_device)}",
            f"peak memory per device ({how}, eval step): {gib(self.eval_peak_bytes_per_device)}",
            f"memory source: {self.memory_source}",
        ]



_STAGES = {"on": False, "started": time.monotonic()}  # `run --dry_run` reports its stages; plan's compile does not


def stage(text: str) -> None:
    """One progress line of `run --dry_run` (a full-size compile can take minutes): what it does now, and when."""
    if _STAGES["on"]:
        print(f"dry run [{time.monotonic() - _STAGES['started']:6.0f} s]: {text} ...", flush=True)


def stages_on() -> None:
    """Turns the stage lines on (the `run --dry_run` command; a compile `plan` asks for stays quiet)."""
    _STAGES.update(on=True, started=time.monotonic())
