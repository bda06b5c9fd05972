"""dlrmv4's eval metric: the exact AUC of every scored sample of the eval window, with ties counted a half.

The reference logs torchrec's AUC over the whole pass (torchrec metrics/auc.py `_compute_auc_helper`: sort by
score, trapezoid of cumulative true against false positives), which is the Mann-Whitney statistic with ties
broken by sort order; counting a tie as a half is the order-free form of it, and what
sklearn.metrics.roc_auc_score computes. The harness gathers every replica's per-example scores to the chief
before this runs, so the AUC is the global one, never an average of per-replica AUCs.
"""
from __future__ import annotations

import numpy as np


def exact_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """P(score of a positive > score of a negative) + P(equal) / 2 over all positive-negative pairs, from
    average ranks (float64); 0.5 when a class is absent, as torchrec returns."""
    scores = np.asarray(scores, np.float64).reshape(-1)
    labels = np.asarray(labels).reshape(-1) > 0.5
    positives, total = int(labels.sum()), labels.size
    negatives = total - positives
    if positives == 0 or negatives == 0:
        return 0.5
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # Average 1-based rank of each run of equal scores.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], total]
    run_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(total, np.float64)
    ranks[order] = np.repeat(run_rank, ends - starts)
    rank_sum = ranks[labels].sum()
    return float((rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives))
