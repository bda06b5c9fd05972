"""The MLPerf/tensor2tensor subword tokenizer, reimplemented so the reference vocab file gives the reference ids.

Encoding splits text into runs of alphanumeric (Unicode L*/N*) and other characters, drops the single space
between two alphanumeric runs, escapes each run (``_`` -> ``\\u``, ``\\`` -> ``\\\\``, a character outside the
vocab's alphabet -> ``\\NNN;``), marks its end with ``_`` and splits it greedily into the longest subtokens in
the vocab. Decoding reverses this, putting a space back between two adjacent alphanumeric tokens. The mapping
is lossless for any text, so BLEU can be computed on ``decode(ids)`` against the raw reference sentence.
"""
from __future__ import annotations

import functools
import os
import re
import unicodedata
from typing import Sequence

from harness.errors import HarnessError

PAD_ID = 0
EOS_ID = 1
RESERVED = ("<pad>", "<EOS>")
# The checked-in WMT vocab spells its reserved lines with the end-of-token mark; the reference writer does not.
RESERVED_UNDERSCORE = ("<pad>_", "<EOS>_")
# Characters escaping can produce; every alphabet includes them so that any text is encodable.
_ESCAPE_CHARS = frozenset("\\_u;0123456789")
_UNESCAPE_RE = re.compile(r"\\u|\\\\|\\([0-9]+);")
_UNDEFINED = "\u3013"  # what an unparsable \NNN; decodes to, as in the reference


@functools.lru_cache(maxsize=1 << 16)
def _is_alnum(c: str) -> bool:
    return unicodedata.category(c)[0] in "LN"


def split_tokens(text: str) -> list[str]:
    """Alternating alphanumeric / other runs; a lone space between two alphanumeric runs is implied, so dropped."""
    if not text:
        return []
    out = []
    start = 0
    for pos in range(1, len(text)):
        if _is_alnum(text[pos]) != _is_alnum(text[pos - 1]):
            token = text[start:pos]
            if token != " " or start == 0:
                out.append(token)
            start = pos
    out.append(text[start:])
    return out


def join_tokens(tokens: Sequence[str]) -> str:
    """Inverse of `split_tokens`: a space goes back only between two alphanumeric tokens."""
    out = []
    for i, token in enumerate(tokens):
        if i > 0 and _is_alnum(tokens[i - 1][0]) and _is_alnum(token[0]):
            out.append(" ")
        out.append(token)
    return "".join(out)


def escape_token(token: str, alphabet: frozenset[str] | set[str]) -> str:
    token = token.replace("\\", "\\\\").replace("_", "\\u")
    return "".join(c if c in alphabet and c != "\n" else f"\\{ord(c)};" for c in token) + "_"


def _unescape_match(m: re.Match) -> str:
    if m.group(1) is None:
        return "_" if m.group(0) == "\\u" else "\\"
    try:
        return chr(int(m.group(1)))
    except (ValueError, OverflowError):
        return _UNDEFINED


def unescape_token(token: str) -> str:
    return _UNESCAPE_RE.sub(_unescape_match, token)


def _unquote(line: str, path: str, lineno: int) -> str:
    s = line.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    raise HarnessError(f"vocab file {path} line {lineno}: expected a quoted subtoken, got {line.rstrip()!r}")


class Subtokenizer:
    """Subword encoder/decoder over a reference-format vocab file (one quoted subtoken per line).

    Reserved ids are always ``<pad>`` = 0 and ``<EOS>`` = 1. How the file's lines map to ids depends on
    `reserved_spelling`:

    - ``("<pad>_", "<EOS>_")``: the first two lines are the reserved tokens as in the checked-in 33,708-line
      WMT vocab. Line i gets id i, so that file gives ``vocab_size == 33708``, the reference model's size.
      (The reference loader would prepend two more entries and shift every id by 2; we do not.)
    - ``("<pad>", "<EOS>")``: the spelling the reference's own writer uses. Those lines are removed wherever
      they are and re-inserted as ids 0 and 1, so the remaining lines get ids 2, 3, ... in file order.
    - ``None``: the file has neither; ``<pad>``/``<EOS>`` are prepended and line i gets id i + 2.
    """

    def __init__(self, subtokens: Sequence[str]):
        subtokens = list(subtokens)
        if tuple(subtokens[:2]) == RESERVED_UNDERSCORE:
            self._spelling: tuple[str, str] | None = RESERVED_UNDERSCORE
            self._list = subtokens
        else:
            self._spelling = RESERVED if any(s in RESERVED for s in subtokens) else None
            self._list = list(RESERVED) + [s for s in subtokens if s not in RESERVED]
        self._ids = {s: i for i, s in enumerate(self._list) if i >= 2}
        self._alphabet = frozenset(c for s in self._list for c in s) | _ESCAPE_CHARS
        self._max_len = max(len(s) for s in self._list)
        self._cache: dict[str, list[int]] = {}

    @classmethod
    def from_file(cls, path: str) -> Subtokenizer:
        if not os.path.isfile(path):
            raise HarnessError(f"vocab file {path} does not exist")
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        while lines and not lines[-1].strip():
            lines.pop()
        if not lines:
            raise HarnessError(f"vocab file {path} is empty")
        return cls([_unquote(line, path, n) for n, line in enumerate(lines, 1)])

    @property
    def vocab_size(self) -> int:
        return len(self._list)

    @property
    def reserved_spelling(self) -> tuple[str, str] | None:
        """The reserved lines as the file spelled them, or None when the file had none (so they were prepended)."""
        return self._spelling

    @property
    def subtokens(self) -> list[str]:
        return list(self._list)

    def encode(self, text: str) -> list[int]:
        """Subtoken ids of `text`, without EOS (the caller appends EOS_ID)."""
        out: list[int] = []
        for token in split_tokens(text):
            ids = self._cache.get(token)
            if ids is None:
                ids = self._cache[token] = self._split(escape_token(token, self._alphabet))
            out.extend(ids)
        return out

    def _split(self, escaped: str) -> list[int]:
        out, start, n = [], 0, len(escaped)
        while start < n:
            for end in range(min(n, start + self._max_len), start, -1):
                i = self._ids.get(escaped[start:end])
                if i is not None:
                    out.append(i)
                    start = end
                    break
            else:
                raise HarnessError(f"the vocab has no subtoken for {escaped[start]!r} (in {escaped!r}); "
                                   "a vocab must hold every single character of its alphabet")
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`. Reserved and out-of-range ids are skipped; cutting at EOS is the caller's job."""
        n = len(self._list)
        pieces = [self._list[i] for i in map(int, ids) if 2 <= i < n]
        return join_tokens([unescape_token(t) for t in "".join(pieces).split("_") if t])


def write_vocab_file(path: str, subtokens: Sequence[str]) -> None:
    """One single-quoted subtoken per line, the reference writer's format."""
    with open(path, "w", encoding="utf-8") as f:
        for s in subtokens:
            if "\n" in s:
                raise ValueError(f"subtoken {s!r} contains a newline")
            f.write(f"'{s}'\n")
