"""Training pipelines that call Python are refused where the pipeline runs outside this process (a TPU
slice's hosts, tf.data service workers), before any log exists."""
from __future__ import annotations

import os
import types

import pytest

from benchmarks import registry
from benchmarks.transformer.config import DataConfig
from benchmarks.transformer.data import TFDSSource
from harness import config as config_lib
from harness.errors import HarnessError
from harness.runtime import make_runtime
from harness.runtime.base import InputContext
from harness.train import remote_input

pytestmark = pytest.mark.quick

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TPU = types.SimpleNamespace(kind="tpu")
DEFAULT = types.SimpleNamespace(kind="default")


def test_transformer_tfds_pipeline_is_refused_on_tpu_and_through_the_service(tmp_path):
    import tensorflow_datasets as tfds

    from test_transformer import write_vocab
    write_vocab(str(tmp_path / "vocab"))
    cfg = DataConfig(source="tfds", data_dir=str(tmp_path), vocab_file=str(tmp_path / "vocab"),
                     max_sequence_length=400, row_length=400, train_samples=10, eval_samples=5, shuffle_buffer=4)
    with tfds.testing.mock_data(num_examples=5):
        source = TFDSSource(cfg)
        # The subword encoder is a tf.numpy_function(stateful=False); the mock's own examples may come from
        # a Python generator too (PyFunc).
        assert "PyFuncStateless" in remote_input.python_ops(source.train_rows(InputContext(1, 0, 2, seed=1)))
        workload = types.SimpleNamespace(NAME="transformer", cfg=types.SimpleNamespace(seed=1, data=cfg),
                                         train_dataset=source.train_rows)
        remote_input.check(workload, DEFAULT, service=False)  # runs in this process: fine
        for runtime, service, where in ((TPU, False, "runtime.kind=tpu"), (DEFAULT, True, "data.service")):
            with pytest.raises(HarnessError) as e:
                remote_input.check(workload, runtime, service)
            text = str(e.value)
            assert text.startswith(where) and "data.source=tfds" in text and "PyFuncStateless" in text, text
            assert "\n" not in text


@pytest.mark.parametrize("name", ["resnet", "bert", "transformer", "ssd", "gpt_oss_20b"])
def test_synthetic_pipelines_call_no_python(name):
    cfg = config_lib.load_config(os.path.join(REPO, "configs", name, "smoke.yaml"), [])
    workload = registry.get(name)(cfg, make_runtime(cfg.runtime))
    assert remote_input.python_ops(workload.train_dataset(InputContext(1, 0, 2, seed=1))) == []
    remote_input.check(workload, TPU, service=True)
