"""The decoder tests' numpy references for attention: a softmax and dense masked attention, one query at a
time, with gpt-oss's optional sink logit (transformers' `GptOssAttention`: one more column per query head in
the softmax, dropped after it)."""
from __future__ import annotations

import math

import numpy as np


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def masked_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, window: int, sinks: np.ndarray | None = None,
                     segments: np.ndarray | None = None) -> np.ndarray:
    """Causal attention over the last `window` positions (and within a document where `segments` [b, s] is
    given). q [b, s, kv, g, d], k/v [b, s, kv, d], sinks [kv, g] or None."""
    b, s, kv, g, d = q.shape
    out = np.zeros_like(q)
    for bi in range(b):
        for qi in range(s):
            keys = [ki for ki in range(s) if ki <= qi and qi - ki < window
                    and (segments is None or segments[bi, ki] == segments[bi, qi])]
            sc = np.einsum("hgd,khd->hgk", q[bi, qi], k[bi, keys]) / math.sqrt(d)
            if sinks is not None:
                sc = np.concatenate([sc, sinks[..., None]], -1)
            p = softmax(sc)[..., :len(keys)]
            out[bi, qi] = np.einsum("hgk,khd->hgd", p, v[bi, keys])
    return out
