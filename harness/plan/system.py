"""Systems as data: one YAML file per system under harness/plan/systems/ (or any path), strictly checked.

Every figure in a system file carries its public source in a comment beside it; the loader only checks
that the figures are present, positive and of the right kind, so a bad file is one `error:` line.

Two tiers of network, stated once: the scale-up domain (`scaleup_chips` chips: an NVLink/Infinity Fabric
node, a GB200/GB300 NVL72 rack of 72 GPUs, a TPU slice up to its pod) joined at `intra_bandwidth` (GPUs) or
its ICI links (TPUs), and the scale-out network between domains at `inter_bandwidth` per chip. A host
(`chips_per_host`) is what one operating system sees: a chip count above one host is a whole number of hosts.
Peaks per precision: `peak_flops` is dense bf16, `peak_flops_fp8` dense fp8 where the chip has it.
"""
from __future__ import annotations

import dataclasses
import os

import yaml

from harness.errors import HarnessError

SYSTEMS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "systems")
TOPOLOGIES = ("torus2d", "torus3d", "hierarchical", "ring")


@dataclasses.dataclass(frozen=True)
class System:
    name: str
    kind: str                 # "tpu" | "gpu"
    peak_flops: float         # dense bf16/fp16 FLOP/s per chip
    hbm_bytes: float
    hbm_bandwidth: float      # bytes/s per chip
    chips_per_host: int
    topology: str
    default_efficiency: float
    allreduce_overlap: float  # share of the backward pass an all-reduce can hide under (0..1)
    cores_per_chip: int = 1
    link_bandwidth: float = 0.0   # torus/ring: bytes/s per link and direction
    links_per_chip: int = 0
    link_latency: float = 0.0
    intra_bandwidth: float = 0.0  # hierarchical: bytes/s per GPU and direction inside a host
    inter_bandwidth: float = 0.0  # hierarchical: bytes/s per GPU and direction between hosts
    intra_latency: float = 0.0
    inter_latency: float = 0.0
    peak_flops_fp8: float = 0.0   # dense fp8 FLOP/s per chip (0: no fp8 unit stated)
    scaleup_chips: int = 0        # chips of one scale-up domain (0: chips_per_host; TPUs: the whole torus)
    step_overhead_seconds: float = 0.0  # fixed per training step (kernel launches, kernels too small to fill
                                        # a chip, the host loop, the step's synchronization), whatever the batch
    device_match: str = ""    # regular expression of the device names this system's chip reports (a run's MFU)
    path: str = ""

    @property
    def domain(self) -> int:
        """Chips of one scale-up domain (NVLink/Infinity Fabric/ICI; a torus without `scaleup_chips`: any)."""
        if self.scaleup_chips:
            return self.scaleup_chips
        return self.chips_per_host if self.topology == "hierarchical" else 1 << 30

    def peak(self, precision: str = "bf16") -> float:
        """Dense peak FLOP/s per chip at `precision` ("bf16" or "fp8"); HarnessError when the file states no
        fp8 peak."""
        if precision == "bf16":
            return self.peak_flops
        if precision == "fp8":
            if not self.peak_flops_fp8:
                raise HarnessError(f"{self.name} states no fp8 peak (peak_flops_fp8); plan it at --precision bf16")
            return self.peak_flops_fp8
        raise HarnessError(f"precision {precision!r}: give bf16 or fp8")


_REQUIRED = ("name", "kind", "peak_flops", "hbm_bytes", "hbm_bandwidth", "chips_per_host", "topology",
             "default_efficiency", "allreduce_overlap")
_NEEDS = {"torus2d": ("link_bandwidth", "links_per_chip"), "torus3d": ("link_bandwidth", "links_per_chip"),
          "ring": ("link_bandwidth",), "hierarchical": ("intra_bandwidth", "inter_bandwidth")}


def available() -> list[str]:
    return sorted(f[:-5] for f in os.listdir(SYSTEMS_DIR) if f.endswith(".yaml"))


def load_system(name_or_path: str) -> System:
    """A system by name (a file in systems/) or by path to a YAML file; HarnessError on anything wrong."""
    path = name_or_path if name_or_path.endswith((".yaml", ".yml")) else os.path.join(SYSTEMS_DIR,
                                                                                     f"{name_or_path}.yaml")
    if not os.path.isfile(path):
        raise HarnessError(f"unknown system {name_or_path!r} (known: {', '.join(available())}; or give a "
                           f"system YAML file)")
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise HarnessError(f"system file {path}: invalid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise HarnessError(f"system file {path}: expected a mapping of figures")
    fields = {f.name: f for f in dataclasses.fields(System) if f.name != "path"}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise HarnessError(f"system file {path}: unknown key(s) {', '.join(unknown)} (valid: {', '.join(fields)})")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise HarnessError(f"system file {path}: missing {', '.join(missing)}")
    if data["topology"] not in TOPOLOGIES:
        raise HarnessError(f"system file {path}: topology {data['topology']!r} is not one of {', '.join(TOPOLOGIES)}")
    if data["kind"] not in ("tpu", "gpu"):
        raise HarnessError(f"system file {path}: kind {data['kind']!r} is not tpu or gpu")
    missing = [k for k in _NEEDS[data["topology"]] if k not in data]
    if missing:
        raise HarnessError(f"system file {path}: topology {data['topology']} needs {', '.join(missing)}")
    values = {}
    for key, value in data.items():
        want = fields[key].type
        if want == "str" and key != "name" and not isinstance(value, str):
            raise HarnessError(f"system file {path}: {key} must be a string, got {value!r}")
        if want in ("float", "int"):
            if isinstance(value, str):
                try:
                    value = float(value)  # PyYAML reads 1e12 without a dot as a string
                except ValueError:
                    pass
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise HarnessError(f"system file {path}: {key} must be a number, got {value!r}")
            if value < 0 or (value == 0 and key in _REQUIRED and key != "allreduce_overlap"):
                raise HarnessError(f"system file {path}: {key} must be positive, got {value!r}")
            value = int(value) if want == "int" else float(value)
        values[key] = value
    if not 0 < values["default_efficiency"] <= 1 or not 0 <= values["allreduce_overlap"] <= 1:
        raise HarnessError(f"system file {path}: default_efficiency must be in (0, 1] and allreduce_overlap "
                           "in [0, 1]")
    return System(path=path, **values)
