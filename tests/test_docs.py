"""The docs hold together: no dead relative link, a short README that starts with the two commands, and a
page for every workload that names each of its configs. Plain text checks, no TensorFlow."""
from __future__ import annotations

import glob
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
README_MAX_LINES = 150

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`]*`")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto: ...


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
