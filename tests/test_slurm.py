"""runtime.kind=multi_worker without TF_CONFIG reads its cluster from the variables srun sets (the
two-process run on 127.0.0.1 is tests/test_multi_worker.py::test_two_processes_fixed_run_id_only_chief_writes
[slurm]); here the reading itself, on the variables of bigger allocations. No processes, no TensorFlow
cluster."""
from __future__ import annotations

import os

import pytest

from harness.config import RuntimeConfig
from harness.errors import HarnessError
from harness.runtime import distribute, make_runtime

pytestmark = pytest.mark.quick


@pytest.fixture
def srun(monkeypatch):
    """Sets the step variables srun would (clearing any real ones and TF_CONFIG)."""
    for key in list(os.environ):
        if key.startswith("SLURM_") or key == "TF_CONFIG":
            monkeypatch.delenv(key)

    def set_step(**values: str) -> None:
        for key, value in values.items():
            monkeypatch.setenv(f"SLURM_{key}", value)
    return set_step


def test_tasks_follow_slurm_node_order_not_string_order(srun):
    """gpu[9-11], one task a node: task 1 runs on gpu10. TensorFlow's SlurmClusterResolver sorts the
    names as strings (gpu10, gpu11, gpu9) and would give task 0 gpu10's address."""
    srun(PROCID="1", STEP_NUM_TASKS="3", STEP_NODELIST="gpu[9-11]", STEP_TASKS_PER_NODE="1(x3)")
    cluster, me = distribute.slurm_cluster(8888)
    assert cluster == {"worker": ["gpu9:8888", "gpu10:8888", "gpu11:8888"]} and me == ("worker", 1)


def test_several_tasks_a_node_get_consecutive_ports(srun):
    srun(PROCID="3", STEP_NUM_TASKS="5", STEP_NODELIST="n[01-02],m5", STEP_TASKS_PER_NODE="2(x2),1")
    cluster, me = distribute.slurm_cluster(20000)
    assert cluster["worker"] == ["n01:20000", "n01:20001", "n02:20000", "n02:20001", "m5:20000"]
    assert me == ("worker", 3)


def test_job_variables_stand_in_for_missing_step_variables(srun):
    srun(PROCID="0", NTASKS="2", JOB_NODELIST="node[1-2]", TASKS_PER_NODE="1(x2)")
    assert distribute.slurm_cluster(8888) == ({"worker": ["node1:8888", "node2:8888"]}, ("worker", 0))


@pytest.mark.parametrize("values,message", [
    (dict(PROCID="0", STEP_NUM_TASKS="2", STEP_TASKS_PER_NODE="2"), "SLURM_STEP_NODELIST is not set"),
    (dict(PROCID="0", STEP_NUM_TASKS="3", STEP_NODELIST="a[1-2]", STEP_TASKS_PER_NODE="1(x2)"),
     "do not give 3 tasks"),
    (dict(PROCID="2", STEP_NUM_TASKS="2", STEP_NODELIST="a[1-2]", STEP_TASKS_PER_NODE="1(x2)"),
     "SLURM_PROCID=2"),
    (dict(PROCID="0", STEP_NUM_TASKS="2", STEP_NODELIST="a[1-2", STEP_TASKS_PER_NODE="1(x2)"),
     "cannot read the job step"),
])
def test_an_incomplete_step_is_one_line(srun, values, message):
    srun(**values)
    with pytest.raises(HarnessError) as e:
        distribute.slurm_cluster(8888)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_neither_tf_config_nor_slurm_is_one_line(srun):
    with pytest.raises(HarnessError) as e:
        make_runtime(RuntimeConfig(kind="multi_worker", cpu_devices=1))
    assert str(e.value).startswith("runtime.kind=multi_worker needs the TF_CONFIG environment variable")
    assert "srun" in str(e.value)
