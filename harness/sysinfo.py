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


COMMIT_FILE = "HARNESS_COMMIT"  # written by `package` into the source it ships (no .git there)


def harness_commit() -> str | None:
    """The harness's git commit, so a result can be traced to the code that produced it; outside a checkout,
    the commit a submission package's source was archived at (its HARNESS_COMMIT file)."""
    packaged = _packaged_commit()
    return packaged if packaged is not None else _git("rev-parse", "HEAD") or None


def _packaged_commit() -> str | None:
    """The HARNESS_COMMIT of packaged source (first: a package may sit inside some other git repository)."""
    try:
        with open(os.path.join(REPO_ROOT, COMMIT_FILE)) as f:
            return f.read().strip() or None
    except OSError:
        return None


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


# --------------------------------------------------------------------------------- facts of a training node

# Facts that must agree between the runs of one result set (one system): what the system description says.
# Hostnames, clock readings and free space are left out: they differ between the nodes of one system.
COMPARED_FACTS = ("host_processors_per_node", "host_processor_model_name", "host_processor_core_count",
                  "host_processor_vcpu_count", "host_memory_capacity", "operating_system", "framework",
                  "accelerators_per_node", "accelerator_model_name", "accelerator_memory_capacity",
                  "number_of_nodes")


def _nvidia_smi() -> list[dict[str, str]]:
    """Name, memory and max SM clock of each GPU on this node, from nvidia-smi (none when it is absent)."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            rows.append({"name": parts[0], "memory": parts[1], "clock": parts[2]})
    return rows


def node_facts(device_type: str, devices_per_node: int, num_nodes: int, device_name: str = "") -> dict[str, str]:
    """The system-description facts of the node a run trains on, recorded in its summary.json.

    `package` builds the system description from these (not from the machine that packages), and refuses a
    result set whose runs disagree on COMPARED_FACTS. Facts not readable here stay 'unknown'.
    """
    facts = host_fields()
    facts.update(hostname=platform.node() or UNKNOWN, number_of_nodes=str(num_nodes),
                 accelerators_per_node=str(devices_per_node) if device_type != "CPU" else "0")
    if device_type == "CPU":
        facts["accelerator_model_name"] = "N/A (CPU only)"
        for key in ("accelerator_host_interconnect", "accelerator_frequency", "accelerator_on-chip_memories",
                    "accelerator_memory_configuration", "accelerator_memory_capacity",
                    "accelerator_interconnect", "accelerator_interconnect_topology"):
            facts[key] = "N/A"
        return facts
    gpus = _nvidia_smi() if device_type == "GPU" else []
    facts["accelerator_model_name"] = (gpus[0]["name"] if gpus else device_name) or f"{UNKNOWN} {device_type}"
    facts["accelerator_memory_capacity"] = gpus[0]["memory"] if gpus else UNKNOWN
    facts["accelerator_frequency"] = gpus[0]["clock"] if gpus else UNKNOWN
    return facts


SOURCE_SUFFIXES = (".py", ".yaml", ".yml", ".md", ".cfg", ".toml", ".txt", ".sh", ".json", ".csv", ".in")
MAX_UNTRACKED_BYTES = 1 << 20


def _size(path: str) -> int:
    try:
        return os.path.getsize(os.path.join(REPO_ROOT, path))
    except OSError:
        return 0


def harness_changes() -> str:
    """What a dirty harness checkout ran beyond its commit, as one patch ('' when clean or not a checkout):
    `git diff HEAD` plus every untracked, unignored file as a new file (a plain diff would lose those)."""
    if _packaged_commit() is not None:  # packaged source: no checkout of its own to diff against
        return ""
    patch = _git_raw("diff", "--binary", "HEAD")
    untracked = (_git("ls-files", "--others", "--exclude-standard") or "").splitlines()
    # Source-like files only: a data file or a run's output left unignored in the checkout is no source.
    source = [p for p in untracked if p.endswith(SOURCE_SUFFIXES) and _size(p) <= MAX_UNTRACKED_BYTES]
    skipped = sorted(set(untracked) - set(source))
    if skipped:  # text before the first `diff --git` is commentary to git apply
        patch = f"untracked files not recorded (not source, or over 1 MB): {', '.join(skipped[:20])}\n" + patch
    for path in source:  # `git diff --no-index` exits 1 for "differs", which a new file always does
        patch += _git_raw("diff", "--binary", "--no-index", "/dev/null", path)
    return patch


def _git_raw(*args: str) -> str:
    """A git command's whole stdout, unstripped (a patch's last line needs its newline); '' on failure."""
    try:
        out = subprocess.run(["git", "-C", REPO_ROOT, *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout if out.returncode in (0, 1) else ""


def pinned_requirements() -> str:
    """Every installed distribution as `name==version`, sorted: the environment a run trained in."""
    pins = set()
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name")
        if name and name != "mlperf-harness":
            pins.add(f"{name}=={dist.version}")
    return "\n".join(sorted(pins, key=str.lower)) + "\n"
