"""A CPU run that will not fit the host's memory is refused before its log opens; one killed outright (the
out-of-memory killer's SIGKILL) leaves a log no tool takes for a result."""
from __future__ import annotations

import glob
import os
import signal
import types

import pytest

from harness import config as config_lib
from harness.errors import HarnessError
from harness.train import host_memory

from conftest import REPO, cli_in_process, run_signalled, sets, stderr_error_lines

LLAMA = os.path.join(REPO, "configs", "llama31_8b", "smoke.yaml")
GIB = 2 ** 30
# The issue's run: the smoke's tiny model on Llama 3.1's vocabulary at 1024 tokens, batch 8.
LLAMA_VOCAB = ["model.vocab_size=128256", "data.seq_length=1024"]
# Clearly beyond a 24 GiB host: an 8-layer model of width 4096 on that vocabulary (1.07 G parameters).
TOO_BIG = LLAMA_VOCAB + ["model.hidden_size=4096", "model.num_layers=8"]
# The signalled runs below: the smoke cut to one layer on 64 tokens. What is tested is what a signal leaves of a
# run's log, not the model.
SHORT = ["model.num_layers=1", "data.seq_length=64"]


def host(replicas: int = 1, device_type: str = "CPU") -> types.SimpleNamespace:
    return types.SimpleNamespace(num_replicas=replicas, num_hosts=1, device_type=device_type)


def write(root, files: dict[str, str]) -> str:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


MEMINFO = {"proc/meminfo": "MemTotal:       24684092 kB\nMemFree: 100 kB\nMemAvailable:   20971520 kB\n"}


def test_available_memory_reads_the_cgroup_limit_else_memavailable(tmp_path):
    assert host_memory.available_bytes(write(tmp_path / "a", MEMINFO)) == (20 * GIB, "MemAvailable in /proc/meminfo")
    v2 = dict(MEMINFO, **{"sys/fs/cgroup/memory.max": str(8 * GIB), "sys/fs/cgroup/memory.current": str(GIB)})
    got = host_memory.available_bytes(write(tmp_path / "b", v2))
    assert got[0] == 7 * GIB and "memory.max 8.0 GiB" in got[1]
    unlimited = dict(MEMINFO, **{"sys/fs/cgroup/memory.max": "max\n"})
    assert host_memory.available_bytes(write(tmp_path / "c", unlimited))[0] == 20 * GIB
    v1 = dict(MEMINFO, **{"sys/fs/cgroup/memory/memory.limit_in_bytes": str(4 * GIB),
                          "sys/fs/cgroup/memory/memory.usage_in_bytes": str(GIB)})
    assert host_memory.available_bytes(write(tmp_path / "d", v1))[0] == 3 * GIB
    # cgroup v1's "no limit" is a huge number: MemAvailable decides
    v1_none = dict(MEMINFO, **{"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712"})
    assert host_memory.available_bytes(write(tmp_path / "e", v1_none))[0] == 20 * GIB
    # a limit above what the host has left: MemAvailable still bounds it
    roomy = dict(MEMINFO, **{"sys/fs/cgroup/memory.max": str(23 * GIB), "sys/fs/cgroup/memory.current": "0"})
    assert host_memory.available_bytes(write(tmp_path / "f", roomy))[0] == 20 * GIB
    assert host_memory.available_bytes(str(tmp_path / "nothing")) is None


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "configs", "*", "smoke*.yaml"))))
def test_shipped_smoke_configs_estimate_little(path):
    """Every CPU smoke config stays far below any host that runs the suite (2 GiB)."""
    cfg = config_lib.load_config(path, [])
    replicas = cfg.runtime.cpu_devices or (cfg.runtime.mesh.get("data", 1) if cfg.runtime.kind == "mesh" else 1)
    found = host_memory.estimate(cfg, host(replicas))
    assert found is not None and host_memory.RUNTIME_ALLOWANCE < found.total < 2 * GIB, found


def test_decoder_estimate_grows_with_the_loss_and_the_model():
    small = host_memory.estimate(config_lib.load_config(LLAMA, []), host())
    issue = host_memory.estimate(config_lib.load_config(LLAMA, LLAMA_VOCAB), host())
    big = host_memory.estimate(config_lib.load_config(LLAMA, TOO_BIG), host())
    assert small.total < GIB < issue.parts["activations"]
    assert big.total > 24 * GIB and big.parts["weights"] > 3.9 * GIB  # 1.07 G float32 parameters
    # the replicas of a mirrored run each hold the variables; the warm-up copy is one
    two = host_memory.estimate(config_lib.load_config(LLAMA, TOO_BIG), host(2))
    assert two.parts["weights"] == 2 * big.parts["weights"] and two.parts["warm-up copy"] == big.parts["warm-up copy"]
    remat = host_memory.estimate(config_lib.load_config(LLAMA, TOO_BIG + ["model.remat=true"]), host())
    assert remat.parts["activations"] < big.parts["activations"]


def test_refusal_names_the_estimate_and_the_memory_available(monkeypatch):
    cfg = config_lib.load_config(LLAMA, LLAMA_VOCAB)
    need = host_memory.estimate(cfg, host()).total
    monkeypatch.setattr(host_memory, "available_bytes", lambda: (need - GIB, "a test's figure"))
    with pytest.raises(HarnessError) as e:
        host_memory.check(cfg, host())
    message = str(e.value)
    assert f"needs about {need / GIB:.1f} GiB" in message and f"{(need - GIB) / GIB:.1f} GiB are available" in message
    assert "a test's figure" in message and "runtime.host_memory_check=false" in message and "\n" not in message
    monkeypatch.setattr(host_memory, "available_bytes", lambda: (need + GIB, "a test's figure"))
    assert host_memory.check(cfg, host()).total == need
    # not the host's memory, or switched off: not checked
    monkeypatch.setattr(host_memory, "available_bytes", lambda: (GIB // 4, "a test's figure"))
    assert host_memory.check(cfg, host(device_type="GPU")) is None
    off = config_lib.load_config(LLAMA, LLAMA_VOCAB + ["runtime.host_memory_check=false"])
    assert host_memory.check(off, host()) is None


def test_too_big_cpu_run_is_refused_before_its_log_opens(tmp_out):
    """A real `run`: one error line naming both figures, non-zero exit, no run directory or log. The batch
    makes the estimate petabytes, beyond any host the suite runs on."""
    proc = cli_in_process("run", LLAMA, "--output_dir", tmp_out,
                          *sets(model__vocab_size=128256, data__seq_length=8192, schedule__global_batch_size=65536))
    lines = stderr_error_lines(proc)
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: this run needs about ") and " GiB are available (" in lines[0], lines
    assert "Traceback" not in proc.stderr
    assert not os.path.exists(tmp_out) or not any(files for _, _, files in os.walk(tmp_out)), list(os.walk(tmp_out))


def test_run_killed_outright_leaves_an_incomplete_log(tmp_out):
    """SIGKILL after the first progress line (mid-training, as the out-of-memory killer would): the log is
    only under its incomplete name, and `check` fails it as a run that did not finish."""
    code, seen, _ = run_signalled(["run", LLAMA, "--output_dir", tmp_out,
                                   *sets(*SHORT, schedule__target=0.01, run_id="killed")], signal.SIGKILL)
    assert code == -signal.SIGKILL and seen[-1].startswith("sample "), "".join(seen)
    folder = os.path.join(tmp_out, "llama31_8b", "killed")
    assert sorted(os.listdir(folder)) == ["config.yaml", "incomplete_result_1.log"]
    log = os.path.join(folder, "incomplete_result_1.log")
    assert "block_start" in open(log).read()
    check = cli_in_process("check", log)
    assert check.returncode == 1, check.stdout + check.stderr
    assert "no run_stop: the run did not finish" in check.stdout
    assert "Required EXACTLY_ONE occurrence of 'run_stop' but found 0" in check.stdout
    # the same run_id again: refused before anything is written over the evidence (mllog appends)
    again = cli_in_process("run", LLAMA, "--output_dir", tmp_out, *sets(*SHORT, run_id="killed"))
    lines = stderr_error_lines(again)
    assert again.returncode == 2 and len(lines) == 1 and "holds the log of an unfinished run" in lines[0], again.stderr
    assert sorted(os.listdir(folder)) == ["config.yaml", "incomplete_result_1.log"]


def test_run_stopped_by_sigterm_ends_its_log_aborted(tmp_out, tmp_path):
    """SIGTERM (SLURM, Kubernetes, preemption) after the first progress line: one `error:` line naming it, exit
    143, the log under its incomplete name ending with the signal and an aborted run_stop, which `check` fails;
    the same run_id again is refused and leaves every file as it was."""
    stderr_path = tmp_path / "stderr"
    with open(stderr_path, "w") as stderr:
        code, seen, after = run_signalled(["run", LLAMA, "--output_dir", tmp_out,
                                           *sets(*SHORT, schedule__target=0.01, run_id="terminated")], signal.SIGTERM,
                                          stderr)
    err = stderr_path.read_text()
    assert code == 128 + signal.SIGTERM, "".join(seen + after) + err
    assert [line for line in err.splitlines() if line.startswith("error:")] == ["error: interrupted by SIGTERM"], err
    assert "Traceback" not in err
    folder = os.path.join(tmp_out, "llama31_8b", "terminated")
    assert sorted(os.listdir(folder)) == ["config.yaml", "incomplete_result_1.log"]
    log = os.path.join(folder, "incomplete_result_1.log")
    lines = open(log).read().splitlines()
    assert '"key": "harness_interrupted", "value": "SIGTERM"' in lines[-2], lines[-2:]
    assert '"key": "run_stop"' in lines[-1] and '"status": "aborted", "interrupted_by": "SIGTERM"' in lines[-1]
    check = cli_in_process("check", log)
    assert check.returncode == 1 and "error: [interrupted] the run was stopped by SIGTERM" in check.stdout, \
        check.stdout + check.stderr
    before = {name: open(os.path.join(folder, name), "rb").read() for name in os.listdir(folder)}
    again = cli_in_process("run", LLAMA, "--output_dir", tmp_out, *sets(*SHORT, run_id="terminated"))
    errors = stderr_error_lines(again)
    assert again.returncode == 2 and len(errors) == 1 and "holds the log of an unfinished run" in errors[0], again
    # another seed would write its own log beside it, but config.yaml over this run's
    other = cli_in_process("run", LLAMA, "--output_dir", tmp_out, *sets(*SHORT, run_id="terminated", seed=2))
    assert stderr_error_lines(other) == [f"error: {folder} already holds another run's files (config.yaml, "
                                         f"incomplete_result_1.log); choose another run_id"], other
    assert {name: open(os.path.join(folder, name), "rb").read() for name in os.listdir(folder)} == before
