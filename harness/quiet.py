"""TensorFlow's native start-up lines, kept off the terminal unless asked for.

`import tensorflow` makes its C++ libraries print several lines to file descriptor 2 before absl's
logging is initialised (the oneDNN notice, "All log messages before absl::InitializeLog()"), which no
environment variable silences. The CLI installs `silence_tensorflow_import` so that the first import of
tensorflow, wherever it happens, runs with descriptor 2 pointed at a temporary file: the lines are dropped
when the import succeeds and replayed when it fails. Everything after the import prints as usual.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import tempfile
from typing import Any

VERBOSE_ENV = "MLPERF_HARNESS_VERBOSE"


def verbose_from_env() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(2)
        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 2)
            try:
                self.loader.exec_module(module)
            except BaseException:
                os.dup2(saved, 2)
                captured.seek(0)
                sys.stderr.write(captured.read().decode(errors="replace"))
                raise
            finally:
                os.dup2(saved, 2)
                os.close(saved)


class _QuietFinder(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` through the other finders and wraps its loader; removes itself on first use."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


def silence_tensorflow_import() -> None:
    """Makes the process's first `import tensorflow` quiet on descriptor 2 (a no-op once imported)."""
    if "tensorflow" in sys.modules or any(isinstance(f, _QuietFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _QuietFinder())
