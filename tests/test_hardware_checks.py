"""Wrong hardware is one `error:` line, never a silent run on something else:
`runtime.gpus: 0`, a multi_worker worker without a GPU, a TPU pod config that would resolve to
one host's cores, a closed-division run whose devices differ from `submission.platform`. bfloat16 on GPUs
without bfloat16 math is a warning. No hardware needed: devices and runtimes are stood in."""
from __future__ import annotations

import json
import logging
import os
import types

import pytest
import tensorflow as tf

from harness import config as config_lib
from harness import platforms
from harness.config import RuntimeConfig
from harness.errors import HarnessError
from harness.runtime import distribute, make_runtime

from conftest import SMOKE, cli_in_process

pytestmark = pytest.mark.quick


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text, text
    return text


def test_gpus_zero_is_refused_at_config_load():
    with pytest.raises(HarnessError) as e:
        config_lib.from_dict(RuntimeConfig, {"kind": "mirrored", "gpus": 0}, "runtime")
    assert one_line(e).startswith("config runtime.gpus: 0 would mean every visible GPU")
    assert "runtime.gpus=-1" in str(e.value) and "runtime.cpu_devices=N" in str(e.value)
    with pytest.raises(HarnessError, match="runtime.gpus: 0"):
        config_lib.load_config(SMOKE, ["runtime.kind=mirrored", "runtime.gpus=0"])
    assert config_lib.from_dict(RuntimeConfig, {"gpus": 2}).gpus == 2


@pytest.fixture
def one_task_cluster(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["127.0.0.1:1"]},
                                                "task": {"type": "worker", "index": 0}}))
    assert not tf.config.list_physical_devices("GPU")  # this machine: CPU only


def test_multi_worker_without_a_gpu_needs_the_cpu_opt_in(one_task_cluster):
    with pytest.raises(HarnessError) as e:
        make_runtime(RuntimeConfig(kind="multi_worker"))
    assert one_line(e).startswith("runtime.kind=multi_worker but TensorFlow sees no GPU on this worker")
    assert "runtime.cpu_devices=1" in str(e.value)
    with pytest.raises(HarnessError) as e:
        make_runtime(RuntimeConfig(kind="multi_worker", cpu_devices=2))
    assert "a worker runs on one CPU device" in one_line(e)


def fake_devices(kind: str, n: int) -> list:
    return [tf.config.PhysicalDevice(name=f"/physical_device:{kind}:{i}", device_type=kind) for i in range(n)]


def test_local_tpu_smaller_than_the_declared_slice_is_refused(monkeypatch):
    """One host of a v3-256 pod, TPU_NAME unset: 'local' would be this host's 8 cores."""
    monkeypatch.delenv("TPU_NAME", raising=False)
    real = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: fake_devices("TPU", 8) if kind == "TPU" else real(kind))

    def no_connect(*args, **kwargs):
        raise AssertionError("refused before connecting")

    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", no_connect)
    with pytest.raises(HarnessError) as e:
        make_runtime(RuntimeConfig(kind="tpu"), "tpu-v3-256")
    assert one_line(e).startswith("submission.platform=tpu-v3-256 declares 256 TPU devices, but with "
                                  "runtime.tpu='' and no TPU_NAME this run would use this host's 8 only")
    platforms.check_local_tpu_slice("tpu-v3-8", 8)  # the slice is this host: fine
    platforms.check_local_tpu_slice("cpu-smoke", 8)  # no slice named: nothing to compare


def stub_runtime(kind: str, replicas: int, device_type: str, ways: int = 1, sizes: dict | None = None):
    return types.SimpleNamespace(kind=kind, num_replicas=replicas, device_type=device_type,
                                 spatial_partition_ways=ways, sizes=sizes or {},
                                 description=f"{kind}: {replicas} replica(s) on {device_type}")


@pytest.mark.parametrize("runtime,platform,ok", [
    (stub_runtime("tpu", 8, "TPU"), "tpu-v3-256", False),      # one host's cores for a pod
    (stub_runtime("tpu", 32, "TPU"), "tpu-v3-32", True),
    (stub_runtime("tpu", 8, "TPU", ways=4), "tpu-v3-32", True),  # 8 replicas x 4 cores (spatial)
    (stub_runtime("tpu", 8, "TPU", ways=2), "tpu-v3-32", False),
    (stub_runtime("tpu", 16, "TPU"), "tpu-v4-32", True),        # v4 names count cores: 16 chips
    (stub_runtime("mesh", 8, "TPU", sizes={"data": 8, "model": 4}), "tpu-v3-32", True),
    (stub_runtime("mirrored", 8, "GPU"), "8xgpu", True),
    (stub_runtime("multi_worker", 16, "GPU"), "8xgpu", False),
    (stub_runtime("mirrored", 8, "CPU"), "8xgpu", False),       # right count, wrong device
    (stub_runtime("default", 1, "CPU"), "cpu-smoke", True),     # the name gives no count
    (stub_runtime("mirrored", 8, "GPU"), "replace-with-system-name", True),
])
def test_closed_division_devices_must_match_the_platform(runtime, platform, ok):
    if ok:
        platforms.check_platform_matches(runtime, platform, "closed", False)
        return
    with pytest.raises(HarnessError) as e:
        platforms.check_platform_matches(runtime, platform, "closed", False)
    assert one_line(e).startswith(f"submission.platform={platform} declares ")
    assert "runtime.allow_platform_mismatch=true" in str(e.value)
    # Experiments: the open division, or the explicit override.
    platforms.check_platform_matches(runtime, platform, "open", False)
    platforms.check_platform_matches(runtime, platform, "closed", True)


def test_platform_mismatch_is_one_line_from_the_cli(tmp_path):
    args = ("run", SMOKE, "--output_dir", str(tmp_path), "--set", "submission.platform=8xgpu")
    proc = cli_in_process(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: submission.platform=8xgpu declares 8 GPU(s) but this run has 1 CPU "
                                  "device(s)"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not os.listdir(tmp_path)


def test_dry_run_reads_platforms_from_the_shared_parser():
    from harness.dryrun import standin

    assert standin.tpu_devices is platforms.tpu_devices
    assert platforms.platform_devices("tpu-v3-256") == (256, "TPU")
    assert platforms.platform_devices("16xgpu") == (16, "GPU")
    assert platforms.platform_devices("cpu-smoke") is None


def test_bfloat16_on_gpus_without_bfloat16_math_is_a_warning(monkeypatch, caplog):
    capability = {"/physical_device:GPU:0": (7, 0), "/physical_device:GPU:1": (8, 0)}
    monkeypatch.setattr(tf.config.experimental, "get_device_details",
                        lambda d: {"compute_capability": capability[d.name]})
    v100, a100 = fake_devices("GPU", 2)
    message = distribute.bfloat16_warning("bfloat16", [v100, a100])
    assert message and message.startswith("runtime.precision=bfloat16 on 1 GPU(s) without bfloat16 math "
                                          "(/physical_device:GPU:0: compute capability 7.0 < 8.0)")
    assert distribute.bfloat16_warning("bfloat16", [a100]) is None
    assert distribute.bfloat16_warning("float32", [v100]) is None
    with caplog.at_level(logging.WARNING):
        distribute.warn_bfloat16_without_math("bfloat16", [v100])
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [message]


def test_tpu_strategy_reports_its_hosts():
    """A TPUStrategy runtime counts the slice's hosts (the summary, the system description), not 1."""
    strategy = tf.distribute.TPUStrategy.__new__(tf.distribute.TPUStrategy)
    strategy._extended = types.SimpleNamespace(num_hosts=4)
    runtime = distribute.StrategyRuntime("tpu", strategy, "TPU", "float32", None)
    assert runtime.num_hosts == 4 and runtime.is_chief
    assert runtime.broadcast_from_chief([1.5]).tolist() == [1.5]  # one client: nothing to send
