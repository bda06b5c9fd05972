"""A gpt_oss_20b model built alone at test size: the model tests' one spelling of runtime + scope + GptOss."""
from __future__ import annotations

from typing import Any


def build(cfg: Any, seed: int = 1, max_positions: int = 32, **runtime: Any) -> tuple[Any, Any]:
    """(runtime, model) for a gpt_oss_20b ModelConfig `cfg` on a default one-device runtime (RuntimeConfig
    fields in `runtime`), document ids with end-of-document token 0."""
    from benchmarks.gpt_oss_20b import model
    from harness.config import RuntimeConfig
    from harness.runtime import make_runtime

    rt = make_runtime(RuntimeConfig(**runtime))
    with rt.scope():
        net = model.GptOss(rt, seed, cfg, max_positions, eod_id=0)
    return rt, net
