"""MLPerf BLEU: uncased corpus BLEU-4 with the reference's "intl" tokenization and smoothing.

Same numbers as the reference compute_bleu.py and as ``sacrebleu.corpus_bleu(hyps, [refs], lowercase=True,
tokenize="intl")`` on real corpora, but as a FRACTION in [0, 1] (the 0.7.0 checker wants ``0.25 <= v < 1``).
Statistics are a plain float64 vector so hosts can sum their partial counts and one host finishes the score.

Where the reference and sacrebleu disagree (only on degenerate corpora) this follows the reference: a zero
match count is smoothed to 1/(2^k * possible) and an order with nothing possible is left out of the log-sum
(still dividing by 4). Unlike the reference it returns 0.0 instead of dividing by zero for an empty corpus
or all-empty hypotheses, and it treats ``\\`` as punctuation (the reference's character class accidentally
dropped it).
"""
from __future__ import annotations

import functools
import math
import re
import sys
import unicodedata
from collections import Counter
from typing import Sequence

import numpy as np

MAX_ORDER = 4
# Layout of a stats vector.
HYP_LEN, REF_LEN, MATCH, POSSIBLE = 0, 1, slice(2, 2 + MAX_ORDER), slice(2 + MAX_ORDER, 2 + 2 * MAX_ORDER)
STATS_SIZE = 2 + 2 * MAX_ORDER


def _char_class(prefix: str) -> str:
    """A regex character class of every code point whose Unicode category starts with `prefix`, as ranges."""
    ranges: list[list[int]] = []
    for cp in range(sys.maxunicode + 1):
        if unicodedata.category(chr(cp)).startswith(prefix):
            if ranges and ranges[-1][1] == cp - 1:
                ranges[-1][1] = cp
            else:
                ranges.append([cp, cp])
    parts = [re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges]
    return "[" + "".join(parts) + "]"


@functools.lru_cache(maxsize=1)
def _regexes() -> tuple[re.Pattern, re.Pattern, re.Pattern]:
    punct = _char_class("P")
    return (re.compile(r"(\D)(" + punct + ")"),       # punctuation after a non-digit: split it off
            re.compile("(" + punct + r")(\D)"),       # punctuation before a non-digit: split it off
            re.compile("(" + _char_class("S") + ")"))  # symbols always stand alone


def tokenize(text: str) -> list[str]:
    """The reference's intl tokenization (case is left alone; `bleu_stats` lowercases first)."""
    after_word, before_word, symbol = _regexes()
    text = after_word.sub(r"\1 \2 ", text)
    text = before_word.sub(r" \1 \2", text)
    return symbol.sub(r" \1 ", text).split()


def _ngrams(tokens: list[str]) -> Counter:
    return Counter(tuple(tokens[i:i + n]) for n in range(1, MAX_ORDER + 1) for i in range(len(tokens) - n + 1))


def bleu_stats(hypotheses: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """[hyp_len, ref_len, match_1..4, possible_1..4] summed over the corpus; the sum of two is the union's."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    stats = np.zeros(STATS_SIZE, np.float64)
    for hyp, ref in zip(hypotheses, references):
        h, r = tokenize(hyp.lower()), tokenize(ref.lower())
        stats[HYP_LEN] += len(h)
        stats[REF_LEN] += len(r)
        hc, rc = _ngrams(h), _ngrams(r)
        for gram, count in hc.items():
            stats[2 + MAX_ORDER + len(gram) - 1] += count
            stats[2 + len(gram) - 1] += min(count, rc[gram])
    return stats


def bleu_from_stats(stats: np.ndarray | Sequence[float]) -> float:
    """Corpus BLEU-4 as a fraction in [0, 1]; 0.0 for anything degenerate (no hypothesis tokens, no corpus)."""
    stats = np.asarray(stats, np.float64)
    if stats.shape != (STATS_SIZE,):
        raise ValueError(f"BLEU stats must have shape ({STATS_SIZE},), got {stats.shape}")
    hyp_len, ref_len = stats[HYP_LEN], stats[REF_LEN]
    if hyp_len <= 0:
        return 0.0
    log_sum, smooth = 0.0, 1.0
    for match, possible in zip(stats[MATCH], stats[POSSIBLE]):
        if possible <= 0:
            continue  # the reference's precision 0, which it leaves out of the log-sum
        if match > 0:
            log_sum += math.log(match / possible)
        else:
            smooth *= 2
            log_sum += math.log(1.0 / (smooth * possible))
    bp = math.exp(1.0 - ref_len / hyp_len) if hyp_len < ref_len else 1.0
    return float(math.exp(log_sum / MAX_ORDER) * bp)


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Uncased corpus BLEU-4 of detokenized hypotheses against one reference each, as a fraction."""
    return bleu_from_stats(bleu_stats(hypotheses, references))
