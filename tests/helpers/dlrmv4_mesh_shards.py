"""The dlrmv4 smoke mesh's model and optimizer as built (configs/dlrmv4/smoke-mesh.yaml, 2 logical CPUs set before
TensorFlow starts), for tests/test_dlrmv4_runs.py: prints one RESULT line, {variable path: [global shape, [local
shape per device]]} for every table and every row-wise Adagrad accumulator."""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests", "helpers"))

from step_case import build  # noqa: E402


def main() -> None:
    _, rt, _ = build(os.path.join(REPO, "configs", "dlrmv4", "smoke-mesh.yaml"), [])
    out = {v.path: [list(v.shape), [list(s) for s in rt.local_shapes(v.variable)]]
           for v in rt.variables() if "/tables/" in v.path}
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
