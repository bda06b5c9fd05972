"""Trims public MLPerf result logs to what `plan --calibrate` reads: the MLLOG lines, each cut to start at
`:::MLLOG` (the multi-rank launcher's "N: " prefixes go), with `init_start` kept once (every rank stamps
it). Everything else (shell trace, the command line, stdout chatter) is dropped.

    python tests/data/public_bert_unpad/trim_logs.py SRC_ROOT DEST_ROOT PATH...

reads SRC_ROOT/PATH and writes DEST_ROOT/PATH for each PATH (paths relative to the results repository).
"""
from __future__ import annotations

import os
import sys

MARK = ":::MLLOG"


def trim(text: str) -> str:
    out, seen_init = [], False
    for line in text.splitlines():
        at = line.find(MARK)
        if at < 0:
            continue
        line = line[at:].rstrip()
        if '"key": "init_start"' in line:
            if seen_init:
                continue
            seen_init = True
        out.append(line)
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, dest, paths = argv[0], argv[1], argv[2:]
    for path in paths:
        with open(os.path.join(src, path), encoding="utf-8") as f:
            text = trim(f.read())
        target = os.path.join(dest, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
