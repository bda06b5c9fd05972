"""Campaigns (seeds, resume, bad input) and submission packaging (tree, official checkers, refusals).

One real 5-run campaign on TFRecords (module fixture: five runs of 16px crops) feeds the packaging tests;
refusal tests edit copies of its run directories, so each costs seconds, not runs.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil

import pytest

from harness.submission import campaign, package
from harness.errors import HarnessError

from conftest import REPO, SHORT_RESNET_TFRECORD, cli_in_process, sets, stderr_error_lines

CONFIG = os.path.join(REPO, "configs", "resnet", "smoke-tfrecord.yaml")


@pytest.fixture(scope="module")
def tfrecords(tmp_path_factory) -> str:
    from benchmarks.resnet.tfrecord_writer import write_imagenet_tfrecords

    out = str(tmp_path_factory.mktemp("imagenet-small"))
    write_imagenet_tfrecords(out, 2048, 256, image_size=20, num_classes=10, train_shards=2, eval_shards=1,
                             noise=0.3)
    return out


@pytest.fixture(scope="module")
def overrides(tfrecords) -> list[str]:
    return [f"data.data_dir={tfrecords}"] + SHORT_RESNET_TFRECORD


@pytest.fixture(scope="module")
def campaign5(tmp_path_factory, overrides) -> dict:
    """A real 5-run campaign through the CLI's dispatch in this process (each run is its own process, as the
    campaign starts them; no TensorFlow start for the campaign itself): its directory, stdout and run
    directories."""
    cdir = str(tmp_path_factory.mktemp("campaign5"))
    proc = cli_in_process("campaign", CONFIG, "--runs", "5", "--campaign_dir", cdir, *sets(*overrides))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(os.path.join(cdir, "campaign.json")) as f:
        state = json.load(f)
    return {"dir": cdir, "stdout": proc.stdout, "state": state,
            "run_dirs": [r["run_dir"] for r in state["runs"]]}


def copy_runs(run_dirs: list[str], dest: str) -> list[str]:
    out = []
    for d in run_dirs:
        target = os.path.join(dest, os.path.basename(d))
        shutil.copytree(d, target)
        out.append(target)
    return out


def result_log(run_dir: str) -> str:
    (name,) = [n for n in os.listdir(run_dir) if re.fullmatch(r"result_\d+\.txt", n)]
    return os.path.join(run_dir, name)


def edit_log(run_dir: str, key: str, new_value=None, drop: bool = False) -> None:
    """Rewrites (or drops) the MLLOG line with `key` in a copied run's log."""
    path = result_log(run_dir)
    lines = []
    with open(path) as f:
        for line in f:
            if f'"key": "{key}"' in line:
                if drop:
                    continue
                obj = json.loads(line.split(":::MLLOG", 1)[1])
                obj["value"] = new_value
                line = ":::MLLOG " + json.dumps(obj) + "\n"
            lines.append(line)
    with open(path, "w") as f:
        f.writelines(lines)


# ------------------------------------------------------------------------------------------ campaign

def test_campaign_runs_distinct_seeds_and_scores(campaign5):
    state = campaign5["state"]
    assert state["seeds"] == [1, 2, 3, 4, 5]
    assert [r["status"] for r in state["runs"]] == ["success"] * 5
    assert all(r["compliant"] for r in state["runs"])
    for i, (r, d) in enumerate(zip(state["runs"], campaign5["run_dirs"])):
        assert os.path.basename(d) == f"run_{i}_seed{i + 1}"
        with open(os.path.join(d, "summary.json")) as f:
            summary = json.load(f)
        assert summary["seed"] == i + 1 and summary["data_source"] == "tfrecord"
        assert not summary["synthetic_data"]
    out = campaign5["stdout"]
    assert len(re.findall(r"^run \d/5 seed \d: success", out, re.M)) == 5
    assert re.search(r"olympic score \(harness\): \d+\.\d+ min over 3 run\(s\)", out)


BROKEN_LOG = ':::MLLOG {"key": "init_start"}\n'


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, campaign5, overrides) -> dict:
    """A 3-run campaign found with runs 1-2 finished (copied) and run 3 killed mid-log; then resumed.

    Its missing run is synthetic (cheap, and the synthetic refusal test packages it).
    """
    cdir = tmp_path_factory.mktemp("resume") / "camp"
    workload_dir = cdir / "resnet"
    workload_dir.mkdir(parents=True)
    copy_runs(campaign5["run_dirs"][:2], str(workload_dir))
    broken = workload_dir / "run_2_seed3"
    broken.mkdir()
    (broken / "result_3.txt").write_text(BROKEN_LOG)
    shutil.copy(os.path.join(campaign5["run_dirs"][2], "config.yaml"), broken / "config.yaml")
    args = (CONFIG, overrides + ["data.source=synthetic", "data.synthetic_noise=0.4",
                                 "data.synthetic_label_noise=0.1"])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = campaign.main(*args, runs=3, campaign_dir=str(cdir))
    return {"dir": cdir, "args": args, "code": code, "stdout": buf.getvalue()}


def test_campaign_resumes_only_missing_run_and_redoes_incomplete(resumed, capsys):
    cdir, out = resumed["dir"], resumed["stdout"]
    assert resumed["code"] == 0, out
    assert "2 already finished, continuing" in out
    assert out.count("(finished earlier)") == 2
    assert "redoing as run_2_seed3_attempt2" in out
    broken = cdir / "resnet" / "run_2_seed3"
    assert (broken / "result_3.txt").read_text() == BROKEN_LOG  # never appended to
    assert not (broken / "summary.json").exists()
    redone = cdir / "resnet" / "run_2_seed3_attempt2"
    assert json.loads((redone / "summary.json").read_text())["seed"] == 3
    # The copied runs were not redone: the campaign started exactly one process.
    assert os.listdir(cdir / "console") == ["run_2_seed3_attempt2.log"]
    state = json.loads((cdir / "campaign.json").read_text())
    assert [r["run_id"] for r in state["runs"]] == ["run_0_seed1", "run_1_seed2", "run_2_seed3_attempt2"]

    # Running it again only prints the score; another config in the same directory is refused.
    assert campaign.main(*resumed["args"], runs=3, campaign_dir=str(cdir)) == 0
    assert capsys.readouterr().out.count("(finished earlier)") == 3
    with pytest.raises(HarnessError, match="must share a config"):
        campaign.main(CONFIG, resumed["args"][1][:-3], runs=3, campaign_dir=str(cdir))


def test_campaign_stops_on_bad_input(tmp_path):
    with pytest.raises(HarnessError, match=r"campaign stopped: run 1 \(seed 1\) rejected its input"):
        campaign.main(CONFIG, [f"data.data_dir={tmp_path / 'missing'}"] + SHORT_RESNET_TFRECORD, runs=2,
                      campaign_dir=str(tmp_path / "c"))
    state = json.loads((tmp_path / "c" / "campaign.json").read_text())
    assert [r["status"] for r in state["runs"]] == ["bad_input", "pending"]


def test_campaign_rejects_reserved_overrides(tmp_path):
    with pytest.raises(HarnessError, match="campaign sets seed"):
        campaign.main(CONFIG, ["seed=3"], runs=2, campaign_dir=str(tmp_path))


# ------------------------------------------------------------------------------------------- package

@pytest.fixture(scope="module")
def campaign7(tmp_path_factory, campaign5) -> str:
    """campaign5 grown to 7 launched runs (M > N = 5): runs 6 and 7 are copies of runs 1 and 2 under seeds 6, 7."""
    cdir = str(tmp_path_factory.mktemp("campaign7") / "camp")
    shutil.copytree(campaign5["dir"], cdir)
    state = json.load(open(os.path.join(cdir, "campaign.json")))
    for index, source in ((5, 0), (6, 1)):
        seed = index + 1
        run_id = f"run_{index}_seed{seed}"
        run_dir = os.path.join(cdir, "resnet", run_id)
        shutil.copytree(os.path.join(cdir, "resnet", state["runs"][source]["run_id"]), run_dir)
        os.rename(result_log(run_dir), os.path.join(run_dir, f"result_{seed}.txt"))
        edit_log(run_dir, "seed", seed)
        summary = json.load(open(os.path.join(run_dir, "summary.json")))
        json.dump(dict(summary, seed=seed), open(os.path.join(run_dir, "summary.json"), "w"))
        state["runs"].append(dict(state["runs"][source], index=index, seed=seed, run_id=run_id, run_dir=run_dir))
    json.dump(state, open(os.path.join(cdir, "campaign.json"), "w"))
    return cdir


@pytest.fixture(scope="module")
def packaged(tmp_path_factory, campaign7) -> dict:
    out = str(tmp_path_factory.mktemp("pkg") / "submission")
    proc = cli_in_process("package", campaign7, "--out", out, "--system_field", "host_storage_type=local SSD")
    return {"out": out, "proc": proc}


def test_package_tree_passes_official_package_checker(packaged, campaign7):
    proc, out = packaged["proc"], packaged["out"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    org = os.path.join(out, "mlperf-harness")
    assert sorted(os.listdir(os.path.join(org, "results", "cpu-smoke", "resnet"))) == [
        f"result_{i}.txt" for i in range(5)]
    impl = os.path.join(org, "benchmarks", "resnet", "implementations", "tf2-mlperf-harness")
    files = {"README.md", "config.yaml", "run_and_time.sh", "requirements.txt", "mlperf-harness"}
    assert files <= set(os.listdir(impl))
    # the implementation's source: the harness at the runs' commit (with a dirty tree's recorded changes)
    assert os.path.exists(os.path.join(impl, "mlperf-harness", "harness", "submission", "package.py"))
    assert re.search(r"^tensorflow([-_]cpu)?==2\.", open(os.path.join(impl, "requirements.txt")).read(), re.M)
    assert os.access(os.path.join(impl, "run_and_time.sh"), os.X_OK)
    with open(os.path.join(org, "systems", "cpu-smoke.json")) as f:
        system = json.load(f)
    assert system["status"] == "Available on-premise" and system["division"] == "open"
    assert system["framework"].startswith("TensorFlow 2.")
    assert system["host_storage_type"] == "local SSD" and system["accelerators_per_node"] == "0"
    assert "recorded by each run on its training node" in system["sw_notes"]
    report = json.load(open(os.path.join(out, "package_report.json")))
    assert report["accepted"] and report["ruleset"] == "4.0.0"
    # 7 launched runs: the median of the 3 windows of 5 consecutive runs is submitted, in launch order
    selection = report["selection"]
    assert selection["launched"] == 7 and len(selection["window_scores_min"]) == 3
    start = selection["window_start"]
    assert report["seeds"] == list(range(start, start + 5))
    chosen = [r["chosen"] for r in selection["runs_in_launch_order"]]
    assert chosen == [start <= i + 1 < start + 5 for i in range(7)]
    scores = selection["window_scores_min"]
    assert sorted(scores)[1] == scores[start - 1] and "the median window" in selection["why"]
    assert not os.path.exists(os.path.join(out, package.INCOMPLETE))   # finished: no incomplete marker
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["system_desc_checker"]["verdict"] == "PASS"
    assert checks["compliance_checker 4.0.0 (per log)"]["verdict"] == "PASS"
    assert checks["package_checker 4.0.0"]["verdict"] == "PASS"
    # open division: the RCP rules judge closed results only
    assert checks["rcp_checker"]["verdict"] == "n/a" and "open division" in checks["rcp_checker"]["detail"]
    assert "package ACCEPTED: every official check passed" in proc.stdout
    assert "the median window" in proc.stdout
    with open(checks["package_checker 4.0.0"]["log"]) as f:
        assert "PACKAGE CHECKER FOUND" in f.read()


def test_run_and_time_script_names_no_local_path(packaged, tfrecords):
    impl = os.path.join(packaged["out"], "mlperf-harness", "benchmarks", "resnet", "implementations",
                        "tf2-mlperf-harness")
    script = open(os.path.join(impl, "run_and_time.sh")).read()
    assert '-m harness run "$HERE/config.yaml" --set seed="$SEED"' in script
    assert 'export PYTHONPATH="$HERE/mlperf-harness' in script and 'data.data_dir="$DATA_DIR"' in script
    config = open(os.path.join(impl, "config.yaml")).read()
    assert "source: tfrecord" in config and "run_id: ''" in config and "data_dir: ''" in config
    readme = open(os.path.join(impl, "README.md")).read()
    for text in (script, config, readme):
        assert tfrecords not in text and os.path.dirname(tfrecords) not in text


def test_package_refuses_hand_picked_runs_of_a_campaign(tmp_path, campaign7):
    runs = [os.path.join(campaign7, "resnet", name) for name in sorted(os.listdir(os.path.join(campaign7, "resnet")))]
    assert len(runs) == 7
    with pytest.raises(HarnessError, match=r"runs 1, 2, 3, 4, 6 of the 7 runs campaign .* breaks launch order"):
        package.main(runs[:4] + runs[5:6], str(tmp_path / "out"))
    with pytest.raises(HarnessError, match=r"runs 3, 4, 5, 6, 7 of the 7 .* is a window picked by hand"):
        package.main(runs[2:], str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_package_ruleset_is_the_named_round(tmp_path, five_copies):
    for d in five_copies:  # runs configured for an older round than resnet's newest (4.0.0)
        path = os.path.join(d, "summary.json")
        json.dump(dict(json.load(open(path)), ruleset="3.1.0"), open(path, "w"))
    proc = cli_in_process("package", *five_copies, "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: the runs' config names ruleset 3.1.0, not the newest round with open resnet (4.0.0): name the "
        "round to package for with --ruleset (e.g. --ruleset 4.0.0)"]
    with pytest.raises(HarnessError, match="ruleset 6.1.0 has no open resnet benchmark"):
        package.main(five_copies, str(tmp_path / "out"), ruleset=["6.1.0"])
    proc = cli_in_process("package", *five_copies, "--out", str(tmp_path / "out"), "--set", "seed=1")
    assert proc.returncode == 2 and proc.stderr.startswith("error: --set goes with ")
    assert "`package` does not read it" in proc.stderr


def test_package_refuses_runs_whose_training_nodes_disagree(tmp_path, five_copies):
    path = os.path.join(five_copies[3], "summary.json")
    summary = json.load(open(path))
    summary["node"]["host_memory_capacity"] = "2048 GB"
    json.dump(summary, open(path, "w"))
    with pytest.raises(HarnessError, match="trained on nodes that disagree on host_memory_capacity"):
        package.main(five_copies, str(tmp_path / "out"))


@pytest.fixture
def five_copies(tmp_path, campaign5) -> list[str]:
    return copy_runs(campaign5["run_dirs"], str(tmp_path / "runs"))


def test_package_refuses_synthetic_runs(tmp_path, five_copies, resumed):
    synthetic = str(resumed["dir"] / "resnet" / "run_2_seed3_attempt2")
    with pytest.raises(HarnessError, match=r"1 of 5 run\(s\) trained on SYNTHETIC data"):
        package.main(five_copies[:4] + [synthetic], str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    # Through the CLI: one clear error line, exit code 2, and the whole synthetic campaign is refused too.
    proc = cli_in_process("package", str(resumed["dir"]), "--out", str(tmp_path / "out2"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "error: refusing to package: 1 of 3 run(s) trained on SYNTHETIC")


def test_package_stopped_by_sigterm_is_one_line_and_marked_incomplete(tmp_path, five_copies, monkeypatch):
    """Fault case: SIGTERM while the checkers ran ended `package` with 143 and no line, leaving a tree that
    looked complete. The signal now gives one line (exit 143) and the tree keeps its incomplete marker."""
    import signal

    from harness.train import interrupt

    def stopped(*args, **kwargs):
        raise interrupt.Interrupted(signal.SIGTERM)

    monkeypatch.setattr(package.official, "run_package_checker", stopped)
    out = tmp_path / "out"
    proc = cli_in_process("package", *five_copies, "--out", str(out))
    assert proc.returncode == 143 and len(stderr_error_lines(proc)) == 1 and "SIGTERM" in proc.stderr, proc.stderr
    assert (out / package.INCOMPLETE).exists() and not (out / "package_report.json").exists()


def test_package_refuses_duplicate_seeds(tmp_path, five_copies):
    edit_log(five_copies[4], "seed", 1)
    with pytest.raises(HarnessError, match="duplicate seeds: seed 1 is used by 2 runs"):
        package.main(five_copies, str(tmp_path / "out"))


def test_package_refuses_mixed_batch_sizes(tmp_path, five_copies):
    edit_log(five_copies[2], "global_batch_size", 256)
    with pytest.raises(HarnessError, match="runs mix global batch sizes"):
        package.main(five_copies, str(tmp_path / "out"))


def test_package_refuses_wrong_run_count(tmp_path, five_copies):
    with pytest.raises(HarnessError, match=r"4 resnet run\(s\) given; MLPerf training requires exactly 5"):
        package.main(five_copies[:4], str(tmp_path / "out"))


def test_package_refuses_non_compliant_log(tmp_path, five_copies):
    # cache_clear is required in every division (gradient_accumulation_steps only in closed; these runs
    # are open: a tiny ResNet on real-format files)
    edit_log(five_copies[1], "cache_clear", drop=True)
    with pytest.raises(HarnessError, match="fail the official compliance checker"):
        package.main(five_copies, str(tmp_path / "out"))


def test_package_refuses_unknown_system_field(tmp_path, five_copies):
    with pytest.raises(HarnessError, match="did you mean accelerator_model_name"):
        package.main(five_copies, str(tmp_path / "out"), system_fields=["accelerator_model=A100"])
