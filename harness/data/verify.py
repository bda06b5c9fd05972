"""A config's data files against what the MLPerf references publish about them (`mlperf-harness data verify`).

Dead links, changed dumps and preprocessing that is not deterministic give data that loads and trains but is not
the benchmark's; record counts alone miss most of it. Each workload keeps a manifest beside its code
(`benchmarks/<name>/data_manifest.yaml`, see `load_manifest`): for every set of files its data section names (a
glob under a folder, one file, or a Megatron `<prefix>.bin/.idx` pair), the reference's file names, file count,
sizes, record counts and md5 / sha256 as far as a reference publishes them, each value with its source. A value
no reference publishes is absent, and the set's `unsourced` note says so. A benchmark that reads another's
download names that one's manifest (`same_files_as`) instead of copying it.

The cheap checks (names, presence, sizes, record counts through the counts cache of `datafiles.py`) always
run, and so does the hash of every file up to SMALL_FILE_BYTES with a published hash (a vocabulary, an eval
set: a second to read, and an altered one changes the score while keeping its size and line count); the
hashes of larger files only on request. Hashes are cached beside the data in `.mlperf-harness-hashes.json`,
each under its file's `file_stamp`, so a changed or copied file is hashed again. Every difference is one line
naming the file, what the reference has and what was found; a value whose source is in doubt (`advisory` in
the manifest) gives a warning line instead. A closed-division run on real data makes these checks before its
log opens (`check_closed_data`, from `harness/train/preflight.py`).
"""
from __future__ import annotations

import dataclasses
import glob as globlib
import hashlib
import os
import re
import string
import struct
from typing import Any, Callable, Mapping

import yaml
from absl import logging

from harness.errors import HarnessError
from harness.train import datafiles
from harness.train.reference import lookup

MANIFEST_NAME = "data_manifest.yaml"
HASH_CACHE = ".mlperf-harness-hashes.json"
HASHES = ("md5", "sha256")
HASH_DIGITS = {"md5": 32, "sha256": 64}
SMALL_FILE_BYTES = 64 << 20  # files up to this size with a published hash are hashed in every check
KINDS = ("glob", "file", "prefix")
MAX_LINES_PER_KIND = 10  # per set and kind of difference; the rest is one "... and N more" line


@dataclasses.dataclass(frozen=True)
class Fact:
    """A published value and where it is published (a URL, or a reference repository and path). `advisory`:
    why the value may not hold for correct data; a difference from it is a warning, not a refusal."""
    value: Any
    source: str
    advisory: str = ""


@dataclasses.dataclass(frozen=True)
class FileSet:
    """One set of files a workload's data section names, and what the references publish about it."""
    name: str
    data_sources: tuple[str, ...]      # the data.source values that read this set
    kind: str                          # glob | file | prefix
    key: str                           # config path of the glob, the file or the prefix
    dir_key: str | None                # config path of the folder the key is under (None: the key is a path)
    instead: Mapping[str, str]         # glob -> the glob the source reads when the first matches nothing
    names: Fact | None                 # value: the reference's file names (all of them)
    any_name: Fact | None              # value: names one of which the single file has (kind file)
    records: Fact | None
    counter: str | None                # how records are counted: see COUNTERS
    sizes: Mapping[str, Fact]
    hashes: Mapping[str, Mapping[str, Fact]]   # file name -> {md5|sha256: Fact}
    total_size: Fact | None
    unsourced: str


@dataclasses.dataclass(frozen=True)
class Manifest:
    workload: str
    path: str
    sets: tuple[FileSet, ...]
    note: str


@dataclasses.dataclass
class Report:
    """`errors`: one line each, naming the file and what differs; `checked`: a line per set verified;
    `warnings`: differences from advisory values (the data may still be the reference's)."""
    errors: list[str]
    checked: list[str]
    skipped: str = ""
    warnings: list[str] = dataclasses.field(default_factory=list)


# ------------------------------------------------------------------------------------------ manifests

def manifest_path(workload: str) -> str:
    from harness.config import workload_folder

    return os.path.join(workload_folder(workload), MANIFEST_NAME)


def _fact(node: Any, where: str, key: str = "value") -> Fact | None:
    if node is None:
        return None
    if not isinstance(node, Mapping) or key not in node or not node.get("source"):
        raise HarnessError(f"{where}: a published value needs `{key}` and `source` (where it is published)")
    advisory = node.get("advisory") or ""
    if not isinstance(advisory, str):
        raise HarnessError(f"{where}.advisory must say why the value may not hold (a string), not {advisory!r}")
    return Fact(node[key], str(node["source"]), " ".join(advisory.split()))


def _integer(value: Any, where: str, least: int = 0) -> int:
    """`value` as a count or size; a bool, a float or text is a malformed manifest, not a number to guess."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise HarnessError(f"{where} must be an integer >= {least}, not {value!r}")
    return value


def _number_fact(node: Any, where: str) -> Fact | None:
    fact = _fact(node, where)
    if fact is not None:
        _integer(fact.value, f"{where}.value")
    return fact


def _hash_fact(node: Any, where: str, algorithm: str) -> Fact | None:
    fact = _fact(node, where)
    digits = HASH_DIGITS[algorithm]
    if fact is not None and not re.fullmatch(f"[0-9a-fA-F]{{{digits}}}", str(fact.value)):
        raise HarnessError(f"{where}.value must be {digits} hex digits (an {algorithm}), not {fact.value!r}")
    return fact


def _names(node: Any, where: str) -> Fact | None:
    """`{template: "train-{index:05d}-of-01024", count: 1024, start: 0, source}` or `{list: [...], source}`."""
    if node is None:
        return None
    if isinstance(node, Mapping) and "template" in node:
        fact = _fact(node, where, "template")
        start = _integer(node.get("start", 0), f"{where}.start")
        count = _integer(node.get("count"), f"{where}.count (the number of files)", least=1)
        template = str(fact.value)
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
            names = [template.format(index=i) for i in range(start, start + count)]
        except (KeyError, IndexError, ValueError) as e:
            raise HarnessError(f"{where}.template {template!r} is not a name template with {{index}} "
                               f"({type(e).__name__}: {e})") from None
        if fields != {"index"}:
            raise HarnessError(f"{where}.template {template!r} must hold {{index}} (e.g. "
                               f"train-{{index:05d}}-of-01024) and no other field")
        return Fact(names, fact.source, fact.advisory)
    fact = _fact(node, where, "list")
    if not isinstance(fact.value, list) or not fact.value:
        raise HarnessError(f"{where}.list must name at least one file")
    return Fact([str(v) for v in fact.value], fact.source, fact.advisory)


def _config_key(node: Mapping[str, Any], key: str, where: str) -> str | None:
    value = node.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise HarnessError(f"{where}.{key} must be a config key (text such as data.data_dir), not {value!r}")
    return value


def parse_manifest(data: Mapping[str, Any], path: str) -> Manifest:
    """The manifest a YAML mapping describes; HarnessError naming `path` and the entry for anything malformed."""
    if not isinstance(data, Mapping) or not isinstance(data.get("sets"), Mapping) or not data.get("workload"):
        raise HarnessError(f"{path}: a data manifest is a mapping with `workload` and `sets`")
    sets = []
    for name, node in data["sets"].items():
        where = f"{path}: sets.{name}"
        if not isinstance(node, Mapping):
            raise HarnessError(f"{where} is not a mapping")
        kinds = [k for k in KINDS if k in node]
        if len(kinds) != 1:
            raise HarnessError(f"{where} needs exactly one of {', '.join(KINDS)} (the config key naming its files)")
        records = _number_fact(node.get("records"), f"{where}.records")
        counter = node["records"].get("counter") if records else None
        if records and counter not in COUNTERS:
            raise HarnessError(f"{where}.records.counter must be one of {', '.join(COUNTERS)}")
        files = node.get("files") or {}
        if not isinstance(files, Mapping):
            raise HarnessError(f"{where}.files must map each file name to its published values, not be a "
                               f"{type(files).__name__}")
        sizes, hashes = {}, {}
        for fname, facts in files.items():
            if not isinstance(facts, Mapping):
                raise HarnessError(f"{where}.files.{fname} is not a mapping")
            if "size" in facts:
                sizes[str(fname)] = _number_fact(facts["size"], f"{where}.files.{fname}.size")
            published = {h: _hash_fact(facts[h], f"{where}.files.{fname}.{h}", h) for h in HASHES if h in facts}
            if published:
                hashes[str(fname)] = published
        sources = node.get("data_source") or []
        sources = sources if isinstance(sources, list) else [sources]
        if not sources or not all(isinstance(s, str) for s in sources):
            raise HarnessError(f"{where} needs `data_source`: the data.source values that read it")
        instead = node.get("instead") or {}
        if not isinstance(instead, Mapping):
            raise HarnessError(f"{where}.instead must map a glob to the glob read when it matches nothing")
        sets.append(FileSet(
            name=str(name), data_sources=tuple(sources),
            kind=kinds[0], key=str(_config_key(node, kinds[0], where)), dir_key=_config_key(node, "dir", where),
            instead={str(k): str(v) for k, v in instead.items()},
            names=_names(node.get("names"), f"{where}.names"),
            any_name=_names(node.get("any_name"), f"{where}.any_name"),
            records=records, counter=counter, sizes=sizes, hashes=hashes,
            total_size=_number_fact(node.get("total_size"), f"{where}.total_size"),
            unsourced=" ".join(str(node.get("unsourced", "")).split())))
    return Manifest(str(data["workload"]), path, tuple(sets), " ".join(str(data.get("note", "")).split()))


def load_manifest(workload: str, path: str | None = None) -> Manifest:
    """The workload's manifest (`benchmarks/<workload>/data_manifest.yaml`), or the one at `path` (a test's
    small stand-in in the same format)."""
    path = path or manifest_path(workload)
    if not os.path.isfile(path):
        raise HarnessError(f"no data manifest for {workload} ({path} does not exist)")
    with open(path, encoding="utf-8") as f:
        try:
            data = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise HarnessError(f"{path} is not valid YAML: {str(e).splitlines()[0]}") from None
        except UnicodeDecodeError as e:
            raise HarnessError(f"{path}: not UTF-8 text (byte {e.object[e.start:e.start + 1]!r} at offset "
                               f"{e.start})") from None
    if isinstance(data, Mapping) and data.get("same_files_as"):
        # A benchmark that reads another's download (deepseekv3_671b: llama31_8b's C4) names it once
        other = data["same_files_as"]
        if data.get("workload") != workload or "sets" in data or other == workload:
            raise HarnessError(f"{path}: a manifest with `same_files_as` names its own workload ({workload}) "
                               f"and no sets of its own")
        shared = load_manifest(str(other))
        note = " ".join(str(data.get("note", "")).split()) or shared.note
        return dataclasses.replace(shared, workload=workload, path=f"{path} (the sets of {shared.path})", note=note)
    manifest = parse_manifest(data, path)
    if manifest.workload != workload:
        raise HarnessError(f"{path} is the data manifest of {manifest.workload}, not of {workload}")
    return manifest


# ------------------------------------------------------------------------------------------ counting

def _tfrecords(files: list[str]) -> int:
    return datafiles.counted_records(files)


def _parquet_rows(files: list[str]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    total = 0
    for path in files:
        try:
            total += pq.ParquetFile(path).metadata.num_rows
        except (pa.ArrowException, OSError) as e:
            raise HarnessError(f"{path} is not a readable parquet file ({str(e).splitlines()[0]})") from None
    return total


def _arrow_rows(files: list[str]) -> int:
    """Rows of Arrow IPC stream shards (a Hugging Face `datasets` save_to_disk folder: flux1's embeddings), from
    their record batches' lengths."""
    import pyarrow as pa

    total = 0
    for path in files:
        try:
            total += pa.ipc.open_stream(pa.memory_map(path, "r")).read_all().num_rows
        except (pa.ArrowException, OSError) as e:
            raise HarnessError(f"{path} is not a readable Arrow stream shard ({str(e).splitlines()[0]})") from None
    return total


_IDX_MAGIC = b"MMIDIDX\x00\x00"


def _indexed_sequences(files: list[str]) -> int:
    """Sequences (documents, one each) a Megatron `.idx` announces in its header: magic, u64 version, u8 dtype
    code, u64 sequences, u64 document boundaries."""
    total = 0
    for path in (f for f in files if f.endswith(".idx")):
        with open(path, "rb") as f:
            head = f.read(len(_IDX_MAGIC) + 8 + 1 + 16)
        if len(head) < len(_IDX_MAGIC) + 25 or not head.startswith(_IDX_MAGIC):
            raise HarnessError(f"{path} is not a Megatron MMIDIDX index (bad magic or truncated header)")
        total += struct.unpack("<Q", head[18:26])[0]
    return total


def _lines(files: list[str]) -> int:
    def count() -> int:
        n = 0
        for path in files:
            last = b"\n"
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    n, last = n + block.count(b"\n"), block[-1:]
            n += last != b"\n"  # a last line without its newline is a line
        return n
    return datafiles.cached_count(files, "lines", {}, count)


COUNTERS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "tfrecords": (_tfrecords, "records"),
    "parquet_rows": (_parquet_rows, "rows"),
    "indexed_sequences": (_indexed_sequences, "sequences"),
    "lines": (_lines, "lines"),
    "arrow_rows": (_arrow_rows, "rows"),
}


# ------------------------------------------------------------------------------------------ hashing

def file_hash(path: str, algorithm: str) -> str:
    """`algorithm` (md5 or sha256) of the file, kept in HASH_CACHE beside it under its name and
    `datafiles.file_stamp`: a file changed or copied since is hashed again."""
    stamp = datafiles.file_stamp(path)
    paths = datafiles.cache_paths([path], HASH_CACHE)
    # beside the data a file is known by its name (the folder may move); in the user's cache by its full path
    names = [os.path.basename(path)] + [os.path.abspath(path)] * (len(paths) - 1)
    for cache, name in zip(paths, names):
        entry = datafiles.read_cache(cache).get(name)
        if isinstance(entry, dict) and all(entry.get(k) == v for k, v in stamp.items()) and entry.get(algorithm):
            return str(entry[algorithm])
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            digest.update(block)
    value = digest.hexdigest()
    def entry(old: Any) -> dict:
        kept = dict(old) if isinstance(old, dict) and all(old.get(k) == v for k, v in stamp.items()) else {}
        return {**kept, **stamp, algorithm: value}

    datafiles.write_cache_entry(paths, names, entry)
    return value


# ------------------------------------------------------------------------------------------ verifying

def _limited(lines: list[str], what: str) -> list[str]:
    if len(lines) <= MAX_LINES_PER_KIND:
        return lines
    return lines[:MAX_LINES_PER_KIND] + [f"... and {len(lines) - MAX_LINES_PER_KIND} more {what}"]


def _resolve(fs: FileSet, cfg: Any) -> tuple[str, list[str], list[str]]:
    """(what the config names, the files present, errors): the folder and key the set reads from the config."""
    folder = str(lookup(cfg, fs.dir_key) or "") if fs.dir_key else ""
    value = str(lookup(cfg, fs.key) or "")
    if fs.dir_key and not folder:
        return "", [], [f"{fs.dir_key} is not set (the folder of the {fs.name} files)"]
    if fs.dir_key and not os.path.isdir(folder):
        return "", [], [f"{fs.dir_key}={folder} does not exist (the folder of the {fs.name} files)"]
    if not value:
        return "", [], [f"{fs.key} is not set (the {fs.name} files)"]
    where = os.path.join(folder, value) if folder else value
    if fs.kind == "glob":
        files = sorted(p for p in globlib.glob(where) if os.path.isfile(p))
        if not files and value in fs.instead:  # the other layout the source accepts under the same default
            where = os.path.join(folder, fs.instead[value]) if folder else fs.instead[value]
            files = sorted(p for p in globlib.glob(where) if os.path.isfile(p))
        return where, files, []
    if fs.kind == "file":
        return where, [where] if os.path.isfile(where) else [], []
    return where, [p for p in (where + ".bin", where + ".idx") if os.path.isfile(p)], []


def _expected(fs: FileSet, where: str) -> list[str] | None:
    if fs.names:
        return fs.names.value
    if fs.kind == "prefix":
        return [os.path.basename(where) + ".bin", os.path.basename(where) + ".idx"]
    if fs.kind == "file":
        return [os.path.basename(where)]
    return None


def _check_names(fs: FileSet, where: str, files: list[str]) -> list[str]:
    """Missing and unexpected files; a file the reference's layout lacks paired with one it has not (a rename)."""
    folder = os.path.dirname(where)
    found = {os.path.basename(p) for p in files}
    if fs.kind == "file" and fs.any_name:
        if not files:
            return [f"{where}: missing (the {fs.name} file; source: {fs.any_name.source})"]
        name = os.path.basename(where)
        if name not in fs.any_name.value:
            return [f"{where}: named {name}, the reference's {fs.name} file is "
                    f"{' or '.join(fs.any_name.value)} (source: {fs.any_name.source})"]
        return []
    expected = _expected(fs, where)
    if expected is None:
        return [] if files else [f"{where}: no files match (the {fs.name} files)"]
    source = f"; source: {fs.names.source}" if fs.names else ""
    missing = [n for n in expected if n not in found]
    extra = sorted(found - set(expected))
    span = expected[0] + (f" ... {expected[-1]}" if len(expected) > 1 else "")
    layout = f"{len(expected)} {fs.name} file{'s' if len(expected) > 1 else ''}"
    if not found and len(expected) > 1:
        return [f"{where}: no files match; the reference's layout has {layout} ({span}{source})"]
    if len(expected) > 1 and len(extra) == len(found) > 1:  # another layout altogether: one line for the set
        return [f"{where}: {len(found)} files ({extra[0]} ... {extra[-1]}), none named as the reference's "
                f"{layout} ({span}{source})"]
    lines = _limited([f"{os.path.join(folder, want)}: missing; found {got} instead, which is not a file of the "
                      f"reference's layout ({layout}{source})"
                      for want, got in zip(missing, extra)], "renamed files")
    lines += _limited([f"{os.path.join(folder, n)}: missing (the reference's layout has {layout}{source})"
                       for n in missing[len(extra):]], "missing files")
    lines += _limited([f"{os.path.join(folder, n)}: not a file of the reference's layout ({layout}: {span}"
                       f"{source})" for n in extra[len(missing):]], "unexpected files")
    return lines


def _cited(fact: Fact) -> str:
    """The source of a value in a difference's line; for an advisory value, also why it is only a warning."""
    if fact.advisory:
        return f"(source: {fact.source}; advisory, so a warning only: {fact.advisory})"
    return f"(source: {fact.source})"


def _check_sizes(fs: FileSet, files: list[str], all_present: bool,
                 where: str) -> tuple[list[str], list[str], int]:
    """Published sizes, and the published total when every file is there: (errors, warnings, sizes checked)."""
    errors, warnings, checked = [], [], 0
    by_name = {os.path.basename(p): p for p in files}
    for name, fact in fs.sizes.items():
        if name in by_name:
            size = os.path.getsize(by_name[name])
            checked += 1
            if size != int(fact.value):
                (warnings if fact.advisory else errors).append(
                    f"{by_name[name]}: {size} bytes, the reference's is {int(fact.value)} bytes {_cited(fact)}")
    if fs.total_size and all_present and not errors:
        total = sum(os.path.getsize(p) for p in files)
        if total != int(fs.total_size.value):
            (warnings if fs.total_size.advisory else errors).append(
                f"{where}: {len(files)} files of {total} bytes in all, the reference's are "
                f"{int(fs.total_size.value)} bytes {_cited(fs.total_size)}")
    return errors, warnings, checked


def _check_hashes(fs: FileSet, files: list[str], all_files: bool) -> tuple[list[str], list[str], int, int]:
    """Published hashes of the files present: all of them (`all_files`, --hashes) or those of files up to
    SMALL_FILE_BYTES. Returns (errors, warnings, hashes checked, hashes left unchecked)."""
    errors, warnings, checked, left = [], [], 0, 0
    by_name = {os.path.basename(p): p for p in files}
    for name, published in fs.hashes.items():
        for algorithm, fact in published.items():
            if name not in by_name:
                continue
            if not all_files and os.path.getsize(by_name[name]) > SMALL_FILE_BYTES:
                left += 1
                continue
            value = file_hash(by_name[name], algorithm)
            checked += 1
            if value != str(fact.value).lower():
                (warnings if fact.advisory else errors).append(
                    f"{by_name[name]}: {algorithm} {value}, the reference's is {fact.value} {_cited(fact)}")
    return errors, warnings, checked, left


def applicable_sets(manifest: Manifest, cfg: Any) -> list[FileSet]:
    source = lookup(cfg, "data.source")
    return [fs for fs in manifest.sets if source in fs.data_sources]


def verify(cfg: Any, manifest: Manifest, hashes: bool = False) -> Report:
    """Every set of `manifest` the config's data.source reads, against the files the config names: names,
    presence, sizes, record counts and the published md5 / sha256 of files up to SMALL_FILE_BYTES; with
    `hashes`, of every file. Records are counted and files hashed only in a set whose cheaper checks passed:
    reading files already known to differ would add a second line about the same file and nothing the user
    needs. Differences from advisory values go to the report's warnings."""
    sets = applicable_sets(manifest, cfg)
    if not sets:
        return Report([], [], f"data.source={lookup(cfg, 'data.source')} reads no files the {manifest.workload} "
                              f"manifest describes")
    errors, checked, warnings = [], [], []
    for fs in sets:
        where, files, problems = _resolve(fs, cfg)
        if problems:
            errors += problems
            continue
        names = _check_names(fs, where, files)
        expected = _expected(fs, where)
        all_present = not names and bool(files)
        sizes, size_warnings, n_sizes = _check_sizes(fs, files, all_present, where)
        warnings += size_warnings
        set_errors = names + sizes
        done = [f"{len(files)} file{'s' if len(files) != 1 else ''}" + (" named as published" if expected or
                                                                           fs.any_name else "")]
        if n_sizes:
            done.append(f"{n_sizes} published size{'s' if n_sizes != 1 else ''}")
        if fs.total_size and all_present:
            done.append("the published total size")
        if fs.records and not set_errors and files:
            count, unit = COUNTERS[fs.counter]
            try:
                n = count(files)
            except HarnessError as e:
                set_errors.append(str(e))
            else:
                if n != int(fs.records.value):
                    set_errors.append(f"{where}: {n} {unit}, the reference's {fs.name} set has "
                                      f"{int(fs.records.value)} (source: {fs.records.source})")
                done.append(f"{n} {unit}")
        if fs.hashes and files and not set_errors:  # a set already known to differ is not read again
            hash_errors, hash_warnings, n_hashes, left = _check_hashes(fs, files, hashes)
            set_errors += hash_errors
            warnings += hash_warnings
            if n_hashes:
                done.append(f"{n_hashes} hash{'es' if n_hashes != 1 else ''}")
            if left:
                done.append(f"{left} published hash{'es' if left != 1 else ''} of files over "
                            f"{SMALL_FILE_BYTES >> 20} MB not checked (--hashes)")
        if fs.unsourced:
            done.append("not published: " + fs.unsourced)
        errors += set_errors
        checked.append(f"{fs.name} ({where}): " + "; ".join(done))
    return Report(errors, checked, warnings=warnings)


def verify_config(config_path: str, overrides: list[str], hashes: bool = False,
                  manifest_file: str | None = None) -> tuple[Manifest, Report]:
    """`mlperf-harness data verify CONFIG`: the config's data files against its workload's manifest (or
    `manifest_file`). Builds no workload and no runtime: it reads the config's data section and the files."""
    from harness import config as config_lib

    cfg = config_lib.load_config(config_path, overrides)
    manifest = load_manifest(cfg.workload, manifest_file)
    if lookup(cfg, "data.source") == "synthetic":
        raise HarnessError(f"data.source=synthetic of {cfg.workload} has no files to verify")
    report = verify(cfg, manifest, hashes)
    if report.skipped:
        raise HarnessError(report.skipped)
    return manifest, report


def check_closed_data(workload: Any, manifest_file: str | None = None) -> str:
    """Before a closed-division run's log opens: the checks of `verify` without --hashes (small files' hashes
    included), refused in one line on the first difference; differences from advisory values are logged as
    warnings. Returns what was done, or why nothing was (open division, synthetic data, a source the manifest
    does not describe, such as TFDS, whose own download checks stand)."""
    cfg = workload.cfg
    if cfg.submission.division != "closed":
        return "data verify: skipped (open division)"
    if workload.is_synthetic:
        return "data verify: skipped (synthetic data)"
    if manifest_file is None and not os.path.isfile(manifest_path(cfg.workload)):
        return f"data verify: skipped (no data manifest for {cfg.workload})"
    report = verify(cfg, load_manifest(cfg.workload, manifest_file))
    if report.skipped:
        return f"data verify: skipped ({report.skipped})"
    if report.errors:
        more = len(report.errors) - 1
        tail = f" (and {more} more difference{'s' if more > 1 else ''}: mlperf-harness data verify CONFIG " \
               f"lists them)" if more else ""
        raise HarnessError(f"closed division needs the reference's data: {report.errors[0]}{tail}; "
                           f"use submission.division=open for other data")
    for line in report.warnings:
        logging.warning("data verify: %s", line)
    return "data verify: " + " | ".join(report.checked)
