"""A seeded, learnable En->De-like translation task: the offline stand-in for WMT.

Source (SVO): ``NP_subj V NP_obj [P NP] [ADV] .`` with ``NP = DET ADJ{0..2} N``. Target, over a disjoint
lexicon (only ``.`` is shared): ``SUBJ [ADV] [PP] OBJ V .`` (verb-final), each NP as ``DET N ADJ*`` with the
adjectives reversed, the article form chosen by the gender (one of 3) of a noun that comes later in the
source, and 15% of nouns with two target synonyms drawn at random per occurrence, so even a perfect model
cannot reach BLEU 1.0 (which the 0.7.0 checker would reject). Words are single ids in one shared space:
0 = ``<pad>``, 1 = ``<EOS>``, 2 = ``.``, then source words, then target words.

Measured with bleu.py on ``pairs("eval", 1000)`` (uncased corpus BLEU in percent; seeds 0 / 1 / 2):
copy the source 0.02 / 0.02 / 0.02; monotone word-by-word lexicon (`gloss`: first article form, first
synonym) 1.1 / 1.1 / 1.3; correct order but always the first article form 60 / 59 / 58; the rules with
random synonyms (`translate`, the oracle) 95.0 / 94.7 / 95.3. So crossing 25 needs the reordering, and the
ceiling stays below 100.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from harness.errors import HarnessError

PAD_ID = 0
EOS_ID = 1
PERIOD = "."
N_DET, N_ADJ, N_NOUN, N_VERB, N_PREP, N_ADV, N_GENDER = 3, 30, 60, 40, 8, 10, 3
SYNONYM_FRACTION = 0.15
EVAL_BUCKETS = 10  # one source string in EVAL_BUCKETS (by hash) belongs to eval, the rest to train
_CHUNK = 1024      # candidates drawn per RNG stream, so pairs(split, n) for growing n are prefixes
_SRC_SYLLABLES = ([c + v for c in "bdfgklmnprstvw" for v in "aeiou"], [c + v + "n" for c in "bcdlmprst" for v in "aio"])
_TGT_SYLLABLES = ([c + v for c in ("sch", "z", "ch", "kr", "gr", "pf", "st", "h")
                   for v in ("ei", "au", "ie", "e", "u")],
                  [v + c for v in ("ei", "au", "e", "o") for c in ("ck", "tz", "ng", "rn")])


def _words(rng: np.random.Generator, syllables: tuple[list[str], list[str]], n: int, lengths: tuple[int, int],
           taken: set[str]) -> list[str]:
    """`n` new pseudo-words of lengths[0]..lengths[1] syllables (the last may close), none in `taken`."""
    out: list[str] = []
    while len(out) < n:
        k = int(rng.integers(lengths[0], lengths[1] + 1))
        parts = [syllables[0][int(rng.integers(len(syllables[0])))] for _ in range(k)]
        if rng.random() < 0.3:
            parts[-1] = syllables[1][int(rng.integers(len(syllables[1])))]
        word = "".join(parts)
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


class SyntheticLanguage:
    """Grammar, lexicon and vocabulary of one seed; same encode/decode interface as `subword.Subtokenizer`."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self._entropy = self.seed % (1 << 64)  # numpy wants non-negative seed words
        rng = np.random.default_rng([self._entropy, 0x5EED])
        taken: set[str] = set()
        self.dets = _words(rng, _SRC_SYLLABLES, N_DET, (1, 1), taken)
        self.adjs = _words(rng, _SRC_SYLLABLES, N_ADJ, (2, 3), taken)
        self.nouns = _words(rng, _SRC_SYLLABLES, N_NOUN, (1, 3), taken)
        self.verbs = _words(rng, _SRC_SYLLABLES, N_VERB, (2, 3), taken)
        self.preps = _words(rng, _SRC_SYLLABLES, N_PREP, (1, 2), taken)
        self.advs = _words(rng, _SRC_SYLLABLES, N_ADV, (3, 3), taken)
        # Target: articles[det][gender], one or two translations per noun, one per other word.
        self.articles = [_words(rng, _TGT_SYLLABLES, N_GENDER, (1, 1), taken) for _ in range(N_DET)]
        self.genders = [int(g) for g in rng.integers(N_GENDER, size=N_NOUN)]
        n_syn = round(SYNONYM_FRACTION * N_NOUN)
        has_syn = set(int(i) for i in rng.choice(N_NOUN, size=n_syn, replace=False))
        self.t_nouns = [_words(rng, _TGT_SYLLABLES, 2 if i in has_syn else 1, (1, 3), taken) for i in range(N_NOUN)]
        self.t_adjs = _words(rng, _TGT_SYLLABLES, N_ADJ, (2, 3), taken)
        self.t_verbs = _words(rng, _TGT_SYLLABLES, N_VERB, (2, 3), taken)
        self.t_preps = _words(rng, _TGT_SYLLABLES, N_PREP, (1, 2), taken)
        self.t_advs = _words(rng, _TGT_SYLLABLES, N_ADV, (2, 3), taken)
        source = [PERIOD] + self.dets + self.adjs + self.nouns + self.verbs + self.preps + self.advs
        target = [w for forms in self.articles for w in forms] + [w for syn in self.t_nouns for w in syn] \
            + self.t_adjs + self.t_verbs + self.t_preps + self.t_advs
        self.source_vocab = frozenset(source)
        self._words = ["<pad>", "<EOS>"] + source + target
        self._ids = {w: i for i, w in enumerate(self._words)}
        assert len(self._ids) == len(self._words), "lexicon words collide"
        self._class = {w: (c, i) for c, words in (("det", self.dets), ("adj", self.adjs), ("noun", self.nouns),
                                                  ("verb", self.verbs), ("prep", self.preps), ("adv", self.advs))
                       for i, w in enumerate(words)}
        self._gloss = dict(zip(self.dets + self.adjs + self.nouns + self.verbs + self.preps + self.advs,
                               [a[0] for a in self.articles] + self.t_adjs + [t[0] for t in self.t_nouns]
                               + self.t_verbs + self.t_preps + self.t_advs))

    # --- the Subtokenizer-like interface -------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self._words)

    def encode(self, text: str) -> list[int]:
        """One id per space-separated word, without EOS (the caller appends EOS_ID)."""
        try:
            return [self._ids[w] for w in text.split()]
        except KeyError as e:
            raise HarnessError(f"word {e.args[0]!r} is not in the synthetic language of seed {self.seed}") from None

    def decode(self, ids: Sequence[int]) -> str:
        """Words joined by single spaces; pad, EOS and out-of-range ids are skipped."""
        n = len(self._words)
        return " ".join(self._words[i] for i in map(int, ids) if 2 <= i < n)

    def subtokens(self) -> list[str]:
        """The vocabulary in subword-file spelling (ids identical): words end with ``_``, the period follows a space."""
        return [w if i < 2 else (" ._" if w == PERIOD else w + "_") for i, w in enumerate(self._words)]

    # --- data ----------------------------------------------------------------------------------------------
    def pairs(self, split: str, n: int) -> list[tuple[str, str]]:
        """The first `n` (source, target) pairs of `split` ("train" or "eval"); eval sources never occur in train.

        Candidates come from a fixed seeded stream and each source string is hashed into train or eval, so a
        larger `n` extends a smaller one and the split does not depend on `n`. Eval sources are unique.
        """
        if split not in ("train", "eval"):
            raise HarnessError(f"synthetic split must be 'train' or 'eval', got {split!r}")
        want_eval = split == "eval"
        out: list[tuple[str, str]] = []
        seen: set[str] = set()
        chunk = 0
        while len(out) < n:
            for src, tgt in self._chunk(chunk):
                if self._is_eval(src) != want_eval or (want_eval and src in seen):
                    continue
                seen.add(src)
                out.append((src, tgt))
                if len(out) == n:
                    break
            chunk += 1
        return out

    def _is_eval(self, source: str) -> bool:
        digest = hashlib.blake2b(f"{self.seed}\x00{source}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % EVAL_BUCKETS == 0

    def _chunk(self, k: int) -> list[tuple[str, str]]:
        """Candidate pairs number k*_CHUNK..; all randomness comes from one uniform matrix per chunk."""
        u = np.random.default_rng([self._entropy, 1, k]).random((_CHUNK, 23))
        out = []
        for row in u.tolist():
            subj, obj = self._np(row[0:6]), self._np(row[6:12])
            verb = int(row[12] * N_VERB)
            pp = (int(row[14] * N_PREP), self._np(row[15:21])) if row[13] < 0.5 else None
            adv = int(row[22] * N_ADV) if row[21] < 0.4 else None
            syn = (row[5], row[11], row[20])  # synonym draws for the subject, object and PP nouns
            out.append((self._source(subj, verb, obj, pp, adv), self._target(subj, verb, obj, pp, adv, syn)))
        return out

    @staticmethod
    def _np(r: list[float]) -> tuple[int, list[int], int]:
        """(det, distinct adjectives, noun) from 5 uniforms; 0, 1 or 2 adjectives equally likely."""
        n_adj = int(r[1] * 3)
        a1 = int(r[2] * N_ADJ)
        a2 = (a1 + 1 + int(r[3] * (N_ADJ - 1))) % N_ADJ
        return int(r[0] * N_DET), [a1, a2][:n_adj], int(r[4] * N_NOUN)

    def _source(self, subj, verb, obj, pp, adv) -> str:
        words = self._src_np(subj) + [self.verbs[verb]] + self._src_np(obj)
        if pp is not None:
            words += [self.preps[pp[0]]] + self._src_np(pp[1])
        if adv is not None:
            words.append(self.advs[adv])
        return " ".join(words + [PERIOD])

    def _src_np(self, np_: tuple[int, list[int], int]) -> list[str]:
        det, adjs, noun = np_
        return [self.dets[det]] + [self.adjs[a] for a in adjs] + [self.nouns[noun]]

    def _tgt_np(self, np_: tuple[int, list[int], int], u: float) -> list[str]:
        det, adjs, noun = np_
        syn = self.t_nouns[noun]
        head = [self.articles[det][self.genders[noun]], syn[int(u * len(syn))]]
        return head + [self.t_adjs[a] for a in reversed(adjs)]

    def _target(self, subj, verb, obj, pp, adv, syn: Sequence[float]) -> str:
        words = self._tgt_np(subj, syn[0])
        if adv is not None:
            words.append(self.t_advs[adv])
        if pp is not None:
            words += [self.t_preps[pp[0]]] + self._tgt_np(pp[1], syn[2])
        words += self._tgt_np(obj, syn[1]) + [self.t_verbs[verb], PERIOD]
        return " ".join(words)

    # --- baselines -----------------------------------------------------------------------------------------
    def _parse(self, source: str):
        words = source.split()
        pos = 0

        def take(kind: str) -> int | None:
            nonlocal pos
            if pos < len(words) and self._class.get(words[pos], ("", 0))[0] == kind:
                pos += 1
                return self._class[words[pos - 1]][1]
            return None

        def noun_phrase():
            det = take("det")
            adjs = []
            while (a := take("adj")) is not None:
                adjs.append(a)
            noun = take("noun")
            if det is None or noun is None:
                raise HarnessError(f"not a sentence of the synthetic grammar: {source!r}")
            return det, adjs, noun

        subj = noun_phrase()
        verb = take("verb")
        obj = noun_phrase()
        prep = take("prep")
        pp = (prep, noun_phrase()) if prep is not None else None
        adv = take("adv")
        if verb is None or words[pos:] != [PERIOD]:
            raise HarnessError(f"not a sentence of the synthetic grammar: {source!r}")
        return subj, verb, obj, pp, adv

    def translate(self, source: str, rng: np.random.Generator) -> str:
        """The rules applied exactly, synonyms drawn from `rng`: the best any model can do (BLEU < 1)."""
        return self._target(*self._parse(source), rng.random(3).tolist())

    def gloss(self, source: str) -> str:
        """Monotone word-by-word lexicon: source order, first article form, first synonym (a weak baseline)."""
        return " ".join(self._gloss.get(w, w) for w in source.split())
