"""The docs hold together: no dead relative link, no backticked repository path or `path.py:name` that does
not exist, a short README that starts with the two commands, a page for every workload that names each of its
configs, docs/testing.md's map of every test file, the README's command list, the figures about shipped
configs held to one record (docs/figures.yaml), no count of the workloads in prose, and no citation of what
is outside the repository. Plain text checks (names looked up with `ast`), no TensorFlow."""
from __future__ import annotations

import ast
import glob
import os
import re

import pytest

pytestmark = pytest.mark.quick

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
TESTING = os.path.join(REPO, "docs", "testing.md")
README_MAX_LINES = 150

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`]*`")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto: ...


# A code-span token is a repository path when it starts with one of these directories or ends in one of these
# extensions (and has a slash); `logs/` is left out: what is under it is written by runs, not kept in the repo.
TOP_DIRS = ("harness", "benchmarks", "configs", "docs", "scripts", "tests", ".ci")
EXTENSIONS = (".py", ".md", ".yaml", ".yml", ".json", ".cfg", ".toml", ".txt", ".sh")
# placeholders and patterns, not paths: <name>, {a,b}, globs, "...", $VAR, ~, and upper-case stand-ins (DIR/x)
NOT_A_PATH = re.compile(r"[<>{}*?\[\]$~]|\.\.\.|://|(^|/)[A-Z][A-Z_]*(/|$)")
PATH_TOKEN = re.compile(r"^(?P<path>[\w.-]+(?:/[\w.-]+)*/?)(?:(?P<sep>::?)(?P<name>[\w.]+))?$")


def doc_files() -> list[str]:
    return [README] + sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, in_fence = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            out.append((number, line))
    return out


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text lower-cased, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
    """Every heading anchor of a Markdown file; repeated headings get -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    result = set()
    with open(path, encoding="utf-8") as f:
        for _, line in prose_lines(f.read()):
            m = HEADING.match(line)
            if not m:
                continue
            slug = github_slug(m.group(2))
            if slug in seen:
                seen[slug] += 1
                slug = f"{slug}-{seen[slug]}"
            else:
                seen[slug] = 0
            result.add(slug)
    return result


def relative_links(path: str) -> list[tuple[int, str]]:
    """(line number, target) of every relative link in prose (not in code blocks or code spans)."""
    with open(path, encoding="utf-8") as f:
        lines = prose_lines(f.read())
    links = []
    for number, line in lines:
        for m in LINK.finditer(INLINE_CODE.sub("", line)):
            target = m.group(2)
            if not EXTERNAL.match(target):
                links.append((number, target))
    return links


def dead_links(path: str) -> list[str]:
    problems = []
    for number, target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        where = f"{os.path.relpath(path, REPO)}:{number}: ({target})"
        if not os.path.exists(resolved):
            problems.append(f"{where} no such file {os.path.relpath(resolved, REPO)}")
        elif anchor:
            if not resolved.endswith(".md"):
                problems.append(f"{where} an anchor into a file that is not Markdown")
            elif anchor not in anchors(resolved):
                problems.append(f"{where} no heading #{anchor} in {os.path.relpath(resolved, REPO)}")
    return problems


def path_tokens(text: str) -> list[tuple[int, str]]:
    """(line number, token) of every whitespace-separated token in the prose's code spans and in fenced
    blocks: a span or a block may hold a command, whose arguments are looked at one by one."""
    tokens, in_fence = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        pieces = [line] if in_fence else re.findall(r"`([^`]+)`", line)
        tokens += [(number, token.rstrip(",;")) for piece in pieces for token in piece.split()]
    return tokens


def code_paths(text: str) -> list[tuple[int, str]]:
    """(line number, token) of every repository path in code: a slash-separated token that starts with a
    directory of TOP_DIRS or ends in one of EXTENSIONS, optionally followed by `:name` or `::name` (a
    function, class or constant of that Python file; `Class.method` too). URLs, globs, placeholders and paths
    relative to somewhere else (`../x`) are not repository paths."""
    found = []
    for number, token in path_tokens(text):
        m = PATH_TOKEN.match(token)
        if not m or "/" not in m.group("path") or NOT_A_PATH.search(token):
            continue
        path = m.group("path")
        first = path.split("/")[0]
        if first not in (".", "..") and (first in TOP_DIRS or path.rstrip("/").endswith(EXTENSIONS)):
            found.append((number, token))
    return found


def defined_names(tree: ast.AST) -> dict[str, ast.AST]:
    """Functions, classes and assigned names at the top level of a module or class body."""
    names: dict[str, ast.AST] = {}
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        names[leaf.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
    return names


def missing_path(token: str, repo: str = REPO) -> str | None:
    """Why a code path does not resolve in the repository, or None when it does."""
    m = PATH_TOKEN.match(token)
    path, name = m.group("path"), m.group("name")
    full = os.path.join(repo, path)
    if name and not path.endswith(".py") and os.path.isfile(full + ".py"):
        full += ".py"  # `harness/train/run:execute` names the module without its extension
    if not os.path.exists(full):
        return f"no such file or directory {path}"
    if not name:
        return None
    if not full.endswith(".py"):
        return f"{path} is not a Python file, so it has no name {name}"
    if name.isdigit():
        with open(full, encoding="utf-8") as f:
            return None if int(name) <= len(f.read().splitlines()) else f"{path} has no line {name}"
    with open(full, encoding="utf-8") as f:
        scope: ast.AST = ast.parse(f.read())
    for part in name.split("."):
        scope = defined_names(scope).get(part)
        if scope is None:
            return f"{path} defines no {name}"
    return None


def broken_code_paths(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    problems = []
    for number, token in code_paths(text):
        why = missing_path(token)
        if why:
            problems.append(f"{os.path.relpath(path, REPO)}:{number}: `{token}`: {why}")
    return problems


def test_slug_matches_github():
    assert github_slug("Compile before booking hardware: `run CONFIG --dry_run`") == \
        "compile-before-booking-hardware-run-config---dry_run"
    assert github_slug("Worked example (CPU, ~5 minutes)") == "worked-example-cpu-5-minutes"
    assert github_slug("tf.data service workers: input from other hosts") == \
        "tfdata-service-workers-input-from-other-hosts"


def test_dead_link_is_found(tmp_path):
    """The checker itself fails on a missing file and on a missing heading, and passes a good link."""
    (tmp_path / "b.md").write_text("# Real heading\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#real-heading) [gone](missing.md) [bad](b.md#no-such)\n"
                    "`[in code](nowhere.md)`\n```\n[in a fence](nowhere.md)\n```\n")
    problems = dead_links(str(page))
    assert len(problems) == 2, problems
    assert "missing.md" in problems[0] and "#no-such" in problems[1]


def test_no_dead_relative_links():
    files = doc_files()
    assert len(files) > 5, files
    assert sum(len(relative_links(p)) for p in files) > 20  # the pages do link to each other
    problems = [p for path in files for p in dead_links(path)]
    assert not problems, "dead links:\n" + "\n".join(problems)


def test_code_path_checker_finds_paths_and_names(tmp_path):
    """Paths, `path:name` and commands (in spans and fenced blocks) count; placeholders, globs, URLs and bare
    file names do not; a missing file, a missing name and a missing method are each caught."""
    text = ("`harness/train/loop.py` `benchmarks/lm/` `x/y.yaml` `python scripts/a.py --n 1` `harness/x.py:f`\n"
            "`benchmarks/<name>/` `configs/*/smoke*.yaml` `https://a.b/c.py` `loop.py` `DIR/campaign.json` "
            "`logs/resnet/` `{a,b}/c.py` `coco/2017` `~/.cache/x/` `../up/a.py`\n"
            "```\nrun configs/a.yaml --data ../d\n```\nprose harness/not_code.py\n")
    assert code_paths(text) == [(1, "harness/train/loop.py"), (1, "benchmarks/lm/"), (1, "x/y.yaml"),
                                (1, "scripts/a.py"), (1, "harness/x.py:f"), (4, "configs/a.yaml")]
    (tmp_path / "m.py").write_text("A = 1\nB: int = 2\nclass C:\n    def go(self):\n        pass\n"
                                   "def f():\n    inner = 3\n")
    for good in ("m.py", "m.py:A", "m.py:B", "m.py:C.go", "m.py::f", "m:f", "m.py:7"):
        assert missing_path(good, str(tmp_path)) is None, good
    for bad, why in (("n.py", "no such file"), ("m.py:inner", "defines no"), ("m.py:C.stop", "defines no"),
                     ("m.py:8", "no line"), ("m.py:go", "defines no")):
        assert why in missing_path(bad, str(tmp_path)), bad


def test_backticked_paths_and_names_exist():
    files = doc_files()
    assert sum(len(code_paths(open(p, encoding="utf-8").read())) for p in files) > 50
    problems = [p for path in files for p in broken_code_paths(path)]
    assert not problems, "backticked paths that do not exist:\n" + "\n".join(problems)


def test_readme_is_short_and_starts_with_the_two_commands():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    fences = [i for i, line in enumerate(lines) if FENCE.match(line)]
    assert len(fences) >= 2, "README.md has no command block"
    first_block = [line.split("#")[0].strip() for line in lines[fences[0] + 1:fences[1]]]
    assert "make run" in first_block and "make test" in first_block, first_block


def readme_table_configs() -> dict[str, set[str]]:
    """Config file names in the README's workloads table, by the workload page the row's first cell links
    to (a row with an empty first cell continues the workload above it)."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    found: dict[str, set[str]] = {}
    workload = None
    for _, line in prose_lines(text):
        if not line.startswith("|"):
            continue
        cells = line.strip().strip("|").split("|")
        page = re.search(r"docs/workloads/([\w.-]+)\.md", cells[0])
        if page:
            workload = page.group(1)
        elif cells[0].strip():
            workload = None  # a row of another table
        if workload and len(cells) > 1:
            found.setdefault(workload, set()).update(re.findall(r"[\w.-]+\.yaml", cells[1]))
    return found


def test_every_workload_has_a_page_naming_its_configs():
    config_dirs = sorted(d for d in os.listdir(os.path.join(REPO, "configs"))
                         if os.path.isdir(os.path.join(REPO, "configs", d)))
    assert config_dirs
    table = readme_table_configs()
    missing = []
    for name in config_dirs:
        page = os.path.join(REPO, "docs", "workloads", f"{name}.md")
        if not os.path.exists(page):
            missing.append(f"configs/{name}/ has no page docs/workloads/{name}.md")
            continue
        with open(page, encoding="utf-8") as f:
            page_text = f.read()
        for config in sorted(os.listdir(os.path.join(REPO, "configs", name))):
            if not config.endswith((".yaml", ".yml")):
                continue
            if config not in table.get(name, set()) and not re.search(rf"(?<![\w.-]){re.escape(config)}",
                                                                       page_text):
                missing.append(f"configs/{name}/{config} is named neither in README.md's table nor in "
                               f"docs/workloads/{name}.md")
    assert not missing, "\n".join(missing)


def mapped_test_files() -> dict[str, str]:
    """docs/testing.md's map: test file -> its quick column ("yes" / "no"), from rows whose first cell is a
    backticked tests/test_*.py."""
    with open(TESTING, encoding="utf-8") as f:
        text = f.read()
    rows = {}
    for _, line in prose_lines(text):
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        m = re.fullmatch(r"`(tests/test_\w+\.py)`", cells[0]) if cells else None
        if m:
            rows[m.group(1)] = cells[-1]
    return rows


def test_testing_md_maps_every_test_file_and_its_quick_mark():
    files = sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "tests", "test_*.py")))
    table = mapped_test_files()
    assert len(files) > 40 and len(table) > 40, (len(files), len(table))
    missing = [f for f in files if f not in table]
    assert not missing, "test files docs/testing.md does not map:\n" + "\n".join(missing)
    marked = re.compile(r"^pytestmark = pytest\.mark\.quick$", re.MULTILINE)
    wrong = []
    for f in files:
        with open(os.path.join(REPO, f), encoding="utf-8") as fh:
            quick = "yes" if marked.search(fh.read()) else "no"
        if table[f] != quick:
            wrong.append(f"{f}: docs/testing.md says quick={table[f]!r}, the file's mark says {quick!r}")
    assert not wrong, "\n".join(wrong)


# A citation must be one a reader of the repository can follow: a public repository at a commit, a URL, or a
# page of docs/. These name what only a development machine had: a specification file beside the repository,
# its section numbers, or an absolute path of that machine. (Written so that this file does not match them.)
OUTSIDE_CITATION = re.compile(r"specs[/]|[/]work[/]|\bspecs?(?:'s)?\s+(?:sections?\b|§|\d)|\bthe\s+spec\b",
                              re.IGNORECASE)
NOT_SOURCE = {".git", "__pycache__", "build", "dist", "logs", "report_out"}


def repository_files(repo: str = REPO) -> list[str]:
    """Every file of the repository's tree (what a run, a venv, a tool's cache or a build adds left out)."""
    out = []
    for root, dirs, files in os.walk(repo):
        dirs[:] = [d for d in dirs if d not in NOT_SOURCE and not d.endswith(".egg-info")
                   and (not d.startswith(".") or d in (".ci", ".github")) and not (root == repo and d == "data")]
        out += [os.path.join(root, f) for f in files if f not in NOT_SOURCE]
    return sorted(out)


def outside_citations(repo: str = REPO) -> list[str]:
    found = []
    for path in repository_files(repo):
        with open(path, "rb") as f:
            data = f.read()
        if b"\0" in data:  # binary (safetensors, TFRecords): no prose
            continue
        text = data.decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            low = line.lower()
            if ("spec" in low or "work" in low) and OUTSIDE_CITATION.search(line):
                found.append(f"{os.path.relpath(path, repo)}:{number}: {line.strip()[:120]}")
    return found


def test_the_outside_citation_check_finds_each_kind(tmp_path):
    lines = ["see ../shared/" + "spe" + "cs/x.md", "as in " + "/wo" + "rk/venvs/hfref", "(spec " + "section 5.2)",
             "spec" + " 5.3: the ramp", "the " + "spec's tiny configuration"]
    (tmp_path / "a.py").write_text("\n".join(lines + ["tf.TensorSpec([4]) and element_spec are fine"]) + "\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "b.py").write_text(lines[0] + "\n")
    assert [c.split(":")[1] for c in outside_citations(str(tmp_path))] == ["1", "2", "3", "4", "5"]


def test_no_file_cites_what_is_outside_the_repository():
    found = outside_citations()
    assert not found, "cite the public source (repo@commit:path, a URL) or a docs/ page instead:\n" + "\n".join(found)


# ------------------------------------------------------------------------ figures (docs/figures.yaml)

FIGURES = os.path.join(REPO, "docs", "figures.yaml")
GIB_FIGURE = re.compile(r"(\d[\d,]*(?:\.\d+)?)\s*GiB\b")
CONFIG_PATH = re.compile(r"configs/([\w-]+/[\w.-]+\.yaml)")
COUNTED_WORKLOADS = re.compile(r"\b(\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|"
                               r"fourteen|fifteen)(\s+[\w-]+)?\s+workloads\b", re.IGNORECASE)


def figures() -> dict:
    import yaml

    with open(FIGURES, encoding="utf-8") as f:
        return yaml.safe_load(f)


def config_figures(record: dict) -> list[float]:
    return [v for k, v in record.items() if k.endswith("_gib")]


def current_estimate(key: str, record: dict) -> str:
    """The sentence a workload page states its config's dry-run estimate in: the record's peaks, and the room
    left on the chip the config's `submission.platform` names (harness/platforms.py), computed here."""
    import yaml

    from harness import platforms

    with open(os.path.join(REPO, "configs", key), encoding="utf-8") as f:
        platform = (yaml.safe_load(f).get("submission") or {}).get("platform", "")
    peaks = [(phase, record[f"{phase}_peak_gib"]) for phase in ("train", "eval") if f"{phase}_peak_gib" in record]
    text = (f"Current dry-run estimate of `{os.path.basename(key)}` ([figures.yaml](../figures.yaml)): "
            + ", ".join(f"{phase} peak {value} GiB" for phase, value in peaks) + " per device")
    memory = platforms.device_memory(platform)
    if memory:
        chip = memory[0] / 2**30
        text += (f"; under the {memory[1]}'s {chip:.1f} GiB by "
                 + " and ".join(f"{chip - value:.1f}" for _, value in peaks) + " GiB")
    return text + "."


def flat(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return " ".join(f.read().split())


def test_the_figures_record_names_shipped_configs_and_each_page_states_them():
    record = figures()["dry_run"]
    assert record, FIGURES
    wrong = []
    for key, values in record.items():
        assert os.path.isfile(os.path.join(REPO, "configs", key)), f"{FIGURES}: no configs/{key}"
        assert values.get("measured") and config_figures(values), f"{FIGURES}: {key} needs figures and `measured`"
        page = os.path.join(REPO, "docs", "workloads", key.split("/")[0] + ".md")
        if current_estimate(key, values) not in flat(page):
            wrong.append(f"{os.path.relpath(page, REPO)} should say: {current_estimate(key, values)}")
    assert not wrong, "\n".join(wrong)


def stated_config_figures() -> list[tuple[str, str, list[float]]]:
    """(where, config key, GiB figures) of every README table row and docs line that names one config and
    states GiB: the README's rows name the config by file name under their workload's key."""
    found = []
    workload = None
    for number, line in prose_lines(open(README, encoding="utf-8").read()):
        m = re.search(r"\(`(\w+)`, [\d.]+", line)
        workload = m.group(1) if m and line.startswith("|") else workload
        names = re.findall(r"`([\w.-]+\.yaml)`", line) if line.startswith("|") else []
        if workload and len(names) == 1 and GIB_FIGURE.search(line):
            found.append((f"README.md:{number}", f"{workload}/{names[0]}", line))
    for path in doc_files()[1:]:
        for number, line in prose_lines(open(path, encoding="utf-8").read()):
            keys = set(CONFIG_PATH.findall(line))
            if len(keys) == 1 and GIB_FIGURE.search(line):
                found.append((f"{os.path.relpath(path, REPO)}:{number}", keys.pop(), line))
    return [(where, key, [float(x.replace(",", "")) for x in GIB_FIGURE.findall(line)])
            for where, key, line in found]


def test_every_gib_figure_stated_next_to_a_config_is_in_the_record():
    record = figures()["dry_run"]
    stated = stated_config_figures()
    assert any(where.startswith("README.md") for where, _, _ in stated), "the README's dry-run figures not found"
    wrong = [f"{where}: {key} {numbers}, docs/figures.yaml has {config_figures(record.get(key, {}))}"
             for where, key, numbers in stated
             if not set(numbers) <= set(float(v) for v in config_figures(record.get(key, {})))]
    assert not wrong, "\n".join(wrong)


def test_no_doc_counts_the_workloads():
    """A count of the harness's workloads in prose goes stale with the next family ("all six" stayed after
    the seventh and eighth came): the docs say "every workload"; `mlperf-harness list` counts them. The
    package description names every workload of benchmarks/registry.py or none."""
    from benchmarks import registry

    counted = []
    for path in doc_files():
        for number, line in prose_lines(open(path, encoding="utf-8").read()):
            counted += [f"{os.path.relpath(path, REPO)}:{number}: {m.group(0)}"
                        for m in COUNTED_WORKLOADS.finditer(line)]
    assert not counted, "\n".join(counted)
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO, "setup.cfg"))
    description = cfg["metadata"]["description"]
    keys = [name for name in registry.names() if name in description or name.split("_")[0] in description.lower()]
    assert not COUNTED_WORKLOADS.search(description) and keys in ([], registry.names()), description


def test_the_readme_lists_every_command():
    from harness import cli

    text = open(README, encoding="utf-8").read()
    listed = set(re.findall(r"^mlperf-harness ([\w-]+)", text, re.MULTILINE))
    assert listed == set(cli.COMMANDS), (sorted(set(cli.COMMANDS) - listed), sorted(listed - set(cli.COMMANDS)))
