"""Host facts for an MLPerf system description (`<org>/systems/<system>.json`), read without TensorFlow.

Everything here describes the machine that runs `package`, which is usually the one that ran the
campaign; where it is not, the submitter overrides fields with `--system_field key=value`. Facts that
cannot be read are 'unknown' rather than guessed, so a reviewer can see what was not detected.
Library versions come from installed package metadata (importing TensorFlow would take seconds and
initialise devices just to print a version).
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import subprocess

UNKNOWN = "unknown"

# Every field system_desc_checker requires (mlperf-logging 4.1.68), in its order.
REQUIRED_FIELDS = (
    "submitter", "division", "status", "system_name", "number_of_nodes", "host_processors_per_node",
    "host_processor_model_name", "host_processor_core_count", "host_processor_vcpu_count",
    "host_processor_frequency", "host_processor_caches", "host_processor_interconnect",
    "host_memory_capacity", "host_storage_type", "host_storage_capacity", "host_networking",
    "host_networking_topology", "host_memory_configuration", "accelerators_per_node",
    "accelerator_model_name", "accelerator_host_interconnect", "accelerator_frequency",
    "accelerator_on-chip_memories", "accelerator_memory_configuration", "accelerator_memory_capacity",
    "accelerator_interconnect", "accelerator_interconnect_topology", "cooling", "hw_notes", "framework",
    "other_software_stack", "operating_system", "sw_notes",
)


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", REPO_ROOT, *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def harness_commit() -> str | None:
    """The harness's git commit, so a result can be traced to the code that produced it."""
    return _git("rev-parse", "HEAD") or None


def harness_commit_label() -> str:
    """The commit for people to read: 'unknown' outside a checkout, marked when the tree is dirty."""
    rev = harness_commit()
    if not rev:
        return UNKNOWN
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return rev + (" (with uncommitted changes)" if dirty else "")


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _cpuinfo() -> list[dict[str, str]]:
    """/proc/cpuinfo as one dict per logical CPU (Linux); empty elsewhere."""
    cpus, current = [], {}
    for line in _read("/proc/cpuinfo").splitlines():
        if not line.strip():
            if current:
                cpus.append(current)
            current = {}
            continue
        key, _, value = line.partition(":")
        current[key.strip()] = value.strip()
    if current:
        cpus.append(current)
    return cpus


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.0f} GB"


def cpu_facts() -> dict[str, str]:
    cpus = _cpuinfo()
    vcpus = os.cpu_count() or len(cpus) or 0
    model = next((c["model name"] for c in cpus if c.get("model name")), "") or platform.processor() or UNKNOWN
    sockets = {c.get("physical id") for c in cpus if "physical id" in c}
    cores = {(c.get("physical id"), c.get("core id")) for c in cpus if "core id" in c}
    mhz = [float(c["cpu MHz"]) for c in cpus if re.fullmatch(r"[\d.]+", c.get("cpu MHz", ""))]
    return {
        "host_processors_per_node": str(len(sockets) or 1),
        "host_processor_model_name": model,
        "host_processor_core_count": str(len(cores) or vcpus),
        "host_processor_vcpu_count": str(vcpus),
        "host_processor_frequency": f"{max(mhz):.0f} MHz" if mhz else UNKNOWN,
        "host_processor_caches": cache_facts(),
    }


def cache_facts() -> str:
    """CPU 0's caches from sysfs, e.g. 'L1d 48K, L1i 32K, L2 2048K, L3 107520K'."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    parts = []
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        level = _read(os.path.join(base, name, "level")).strip()
        kind = _read(os.path.join(base, name, "type")).strip()
        size = _read(os.path.join(base, name, "size")).strip()
        if level and size:
            suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
            parts.append(f"L{level}{suffix} {size}")
    return ", ".join(parts) or UNKNOWN


def memory_capacity() -> str:
    m = re.search(r"^MemTotal:\s+(\d+) kB", _read("/proc/meminfo"), re.M)
    return _gb(int(m.group(1)) * 1024) if m else UNKNOWN


def storage_capacity(path: str = ".") -> str:
    try:
        return _gb(shutil.disk_usage(path).total)
    except OSError:
        return UNKNOWN


def operating_system() -> str:
    m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', _read("/etc/os-release"), re.M)
    name = m.group(1) if m else platform.system()
    return f"{name} (kernel {platform.release()})"


def package_version(*names: str) -> str | None:
    """Version of the first installed distribution among `names` (e.g. tensorflow, tensorflow-cpu)."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def tensorflow_version() -> str | None:
    return package_version("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tf-nightly")


def software_stack() -> str:
    parts = [f"Python {platform.python_version()}"]
    for label, names in (("mlperf-harness", ("mlperf-harness",)), ("mlperf-logging", ("mlperf-logging",)),
                         ("numpy", ("numpy",)), ("tensorflow-datasets", ("tensorflow-datasets",)),
                         ("absl-py", ("absl-py",)), ("PyYAML", ("PyYAML", "pyyaml"))):
        version = package_version(*names)
        if version:
            parts.append(f"{label} {version}")
    return ", ".join(parts)


def host_fields(storage_path: str = ".") -> dict[str, str]:
    """The host_* and software fields of a system description, detected on this machine."""
    fields = cpu_facts()
    tf_version = tensorflow_version()
    fields.update({
        "host_processor_interconnect": UNKNOWN,
        "host_memory_capacity": memory_capacity(),
        "host_memory_configuration": UNKNOWN,
        "host_storage_type": UNKNOWN,
        "host_storage_capacity": storage_capacity(storage_path),
        "framework": f"TensorFlow {tf_version}" if tf_version else UNKNOWN,
        "other_software_stack": software_stack(),
        "operating_system": operating_system(),
    })
    return fields
