"""The MLPerf BERT dataset's real-token figures that benchmarks/bert/cost.py states, from the sequence-length
histogram Graphcore published with "Packing: Towards 2x NLP BERT Acceleration" (Krell et al. 2021,
arXiv 2107.02027): `wikipedia_histogram` in blogs_code/packedBERT/histograms.py of graphcore/tutorials
(commit e9dbe4825f034a47871c4db0deb86d727cbd69b9), counts of sequences by real length 1..512. The file is
not shipped here; give a local copy. Its numbers are read as text (the file is not imported).

    python scripts/bert_sequence_lengths.py PATH/TO/histograms.py
"""
from __future__ import annotations

import re
import sys


def read_histogram(text: str, name: str = "wikipedia_histogram") -> list[int]:
    m = re.search(name + r"\s*=\s*np\.array\(\[(.*?)\]", text, re.S)
    if not m:
        raise ValueError(f"no {name} = np.array([...]) in the file")
    return [int(x) for x in m.group(1).replace(",", " ").split()]


def moments(counts: list[int]) -> dict[str, float]:
    """Mean length, and mean length and mean squared length as fractions of the longest (len(counts))."""
    s, n = len(counts), sum(counts)
    mean = sum((i + 1) * c for i, c in enumerate(counts)) / n
    square = sum((i + 1) ** 2 * c for i, c in enumerate(counts)) / n / (s * s)
    f = mean / s
    return {"sequences": n, "max_length": s, "mean_length": mean, "real_token_fraction": f,
            "squared_length_fraction": square, "spread": (square - f * f) / (f - f * f),
            "full_share": counts[-1] / n}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        m = moments(read_histogram(f.read()))
    print(f"{m['sequences']:,} sequences of at most {m['max_length']} tokens: mean real length "
          f"{m['mean_length']:.2f} (real token fraction {m['real_token_fraction']:.4f}, speed-up limit "
          f"{1 / m['real_token_fraction']:.4f}); mean squared length {m['squared_length_fraction']:.4f} x "
          f"{m['max_length']}^2, {m['spread']:.3f} of the way from f^2 to f; {100 * m['full_share']:.1f}% full")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
