"""The system description (`<org>/systems/<system>.json`) of a result set, built from the facts each run
recorded on the node that trained it (summary.json `node`, harness/sysinfo.py `node_facts`), never from the
machine that runs `package`: packaged on a login node or a laptop, that would describe the wrong system and
still pass the checker (the practice of recording them in the job: github.com/mlcommons/logging/issues/241).
"""
from __future__ import annotations

import difflib

from harness import sysinfo
from harness.errors import HarnessError
from harness.submission.runs import Run, names

STATUS_STRINGS_4 = {"onprem": "Available on-premise", "cloud": "Available cloud",
                    "research": "Research, Development, or Internal (RDI)", "preview": "Preview"}
STATUS_STRINGS_OLD = {"onprem": "available", "cloud": "available", "research": "research",
                      "preview": "preview"}


def parse_system_fields(items: list[str]) -> dict[str, str]:
    """`--system_field key=value` items, each a field the system description checker knows."""
    fields = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise HarnessError(f"--system_field {item!r}: expected key=value, e.g. "
                               f"accelerator_model_name='NVIDIA A100-SXM4-80GB'")
        if key not in sysinfo.REQUIRED_FIELDS:
            close = difflib.get_close_matches(key, sysinfo.REQUIRED_FIELDS, n=2)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise HarnessError(f"--system_field {key!r} is not a system description field{hint}")
        fields[key] = value
    return fields


def node_facts(runs: list[Run]) -> dict[str, str]:
    """The training nodes' facts the runs agree on; refuses runs without them or whose facts disagree."""
    missing = [r for r in runs if not isinstance((r.run_json or {}).get("node"), dict)]
    if missing:
        raise HarnessError(f"refusing to package: {names(missing)} recorded no training-node facts (summary.json "
                           f"'node', written by runs of this harness version); the system description would "
                           f"otherwise describe the machine that packages, not the one that trained")
    facts = [r.run_json["node"] for r in runs]
    for key in sysinfo.COMPARED_FACTS:
        values: dict[str, list[Run]] = {}
        for r, f in zip(runs, facts):
            values.setdefault(str(f.get(key, sysinfo.UNKNOWN)), []).append(r)
        if len(values) > 1:
            listing = "; ".join(f"{v!r}: {len(rs)} run(s) ({names(rs, 1)})" for v, rs in values.items())
            raise HarnessError(f"refusing to package: the runs trained on nodes that disagree on {key} ({listing}); "
                               f"a result set is one system")
    return dict(facts[0])


def system_description(runs: list[Run], system: str, ruleset: str,
                       overrides: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The system JSON: the training nodes' facts, the logs' org, division and status, overrides last.

    Returns the description and the fields still 'unknown', which `package` names in one line.
    """
    s = runs[0].summary
    facts = node_facts(runs)
    hosts = sorted({str((r.run_json or {}).get("node", {}).get("hostname")) for r in runs})
    status_key = next((str(e.value) for e in runs[0].events if e.key == "submission_status"), "research")
    table = STATUS_STRINGS_4 if int(ruleset.split(".")[0]) >= 4 else STATUS_STRINGS_OLD
    desc: dict[str, str] = {"submitter": s.org or sysinfo.UNKNOWN, "division": s.division or "closed",
                            "status": table.get(status_key, status_key), "system_name": system}
    desc.update({k: v for k, v in facts.items() if k in sysinfo.REQUIRED_FIELDS})
    if facts.get("number_of_nodes") == "1":
        desc.update(host_networking="N/A (single node)", host_networking_topology="N/A (single node)")
    runtime = (runs[0].run_json or {}).get("runtime") or ""
    desc.update({"cooling": sysinfo.UNKNOWN, "hw_notes": "",
                 "sw_notes": f"mlperf-harness ({runtime}); host and accelerator facts recorded by each run on "
                             f"its training node ({', '.join(hosts[:4])}{' ...' if len(hosts) > 4 else ''})"})
    for key in sysinfo.REQUIRED_FIELDS:
        desc.setdefault(key, sysinfo.UNKNOWN)
    desc.update(overrides)
    ordered = {k: desc[k] for k in sysinfo.REQUIRED_FIELDS}
    unknown = [k for k, v in ordered.items() if str(v).startswith(sysinfo.UNKNOWN)]
    return ordered, unknown
