"""Workload-agnostic machinery of the MLPerf training harness."""
from __future__ import annotations

import importlib.abc
import sys


class _NoKerasAtTensorFlowStart(importlib.abc.MetaPathFinder):
    """Declines the one Keras import TensorFlow makes while it starts.

    `import tensorflow` ends by importing `keras.src.optimizers` "so that any function/method that needs to
    happen at load time will trigger, eg registration of optimizers in the SavedModel registry", inside a
    `try/except ImportError` (tensorflow/tensorflow@v2.21.0:tensorflow/api_template.__init__.py). The
    harness uses no Keras object, and that import is 40% of TensorFlow's start here (Keras 3 pulls in
    matplotlib.pyplot): 7.1 -> 3.8 CPU-s per process, paid by every run and every test's process. Only
    that call is declined; `import keras` and `tf.keras` afterwards load Keras as usual."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001 - importlib's signature
        if name != "keras":
            return None
        frame = sys._getframe(1)
        while frame is not None:
            if (frame.f_code.co_name == "import_module" and frame.f_locals.get("name") == "keras.src.optimizers"
                    and frame.f_back is not None and frame.f_back.f_globals.get("__name__") == "tensorflow"):
                raise ImportError("the harness uses no Keras: skipped at TensorFlow's start")
            frame = frame.f_back
        return None


if "tensorflow" not in sys.modules and not any(isinstance(f, _NoKerasAtTensorFlowStart) for f in sys.meta_path):
    sys.meta_path.insert(0, _NoKerasAtTensorFlowStart())
