"""results/lab/lora_study.py: the pilot's learning-rate rule, and the report's verdicts on
synthetic kept runs (equivalence within the margin, paired by seed; a partial study is
said to be one)."""

import importlib.util
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "results", "lab"))
spec = importlib.util.spec_from_file_location(
    "lora_study", os.path.join(HERE, "..", "results", "lab", "lora_study.py")
)
lora_study = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lora_study)


def test_the_pilot_keeps_each_ranks_best_rate_and_never_a_fallen_run():
    nan = float("nan")
    rows = [
        {"arm": "lora1", "lr": 1e-4, "pass@1": 0.19},
        {"arm": "lora1", "lr": 3e-4, "pass@1": 0.21},
        {"arm": "lora1", "lr": 1e-3, "pass@1": nan},  # fell: no evaluation
        {"arm": "lora8", "lr": 1e-3, "pass@1": 0.20},
        {"arm": "lora8", "lr": 1e-4, "pass@1": 0.20},  # a tie: the smaller rate
        {"arm": "lora32", "lr": 1e-4, "pass@1": nan},
    ]
    assert lora_study.choose(rows) == {"lora1": 3e-4, "lora8": 1e-4, "lora32": 1e-4}


def test_the_pilot_looks_past_an_edge_that_wins():
    nan = float("nan")
    rows = [
        {"arm": "lora1", "lr": 1e-4, "pass@1": 0.18},
        {"arm": "lora1", "lr": 3e-4, "pass@1": 0.19},  # inside the grid: done
        {"arm": "lora1", "lr": 1e-3, "pass@1": 0.15},
        {"arm": "lora8", "lr": 1e-4, "pass@1": 0.20},  # the smallest wins: 3x below
        {"arm": "lora8", "lr": 3e-4, "pass@1": 0.19},
        {"arm": "lora32", "lr": 3e-4, "pass@1": 0.17},
        {"arm": "lora32", "lr": 1e-3, "pass@1": 0.21},  # the largest wins: 3x above
        {"arm": "full", "lr": 1e-4, "pass@1": nan},  # every rate fell: nothing to follow
    ]
    assert lora_study.beyond(rows) == [("lora8", 3.33e-5), ("lora32", 3e-3)]
    rows.append({"arm": "lora8", "lr": 3.33e-5, "pass@1": 0.19})  # the edge moved: done
    rows.append({"arm": "lora32", "lr": 3e-3, "pass@1": 0.20})
    assert lora_study.beyond(rows) == []


def _kept(root, arm, seed, pass1, pass64, base=0.17):
    path = root / f"{arm}-s{seed}"
    os.makedirs(path)
    (path / "config.json").write_text(json.dumps({"seed": seed, "train": {"steps": 300}}))
    rows = [{"step": 0, "eval/average/pass@1": base}, {"step": 300, "reward/mean": 0.2}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    final = {"step": 300, "sampling": {"samples": 64}, "eval/average/pass@1": pass1,
             "eval/average/pass@8": 0.5, "eval/average/pass@64": pass64}  # fmt: skip
    (path / "eval.json").write_text(json.dumps(final))


def _lines(text, arm):
    return [line for line in text.splitlines() if line.startswith(f"| {arm} |")]


def test_the_report_judges_equivalence_within_the_margin(tmp_path, monkeypatch):
    chosen = tmp_path / "pilot_lora.json"
    chosen.write_text(json.dumps({"lora1": 3e-4, "lora8": 1e-3, "lora32": 1e-4}))
    monkeypatch.setattr(lora_study, "CHOSEN", str(chosen))
    full = [(0.21, 0.50), (0.20, 0.52), (0.22, 0.49), (0.21, 0.51), (0.20, 0.50)]
    for seed, (p1, p64) in enumerate(full):
        _kept(tmp_path, "full", seed, p1, p64)
        # rank 1: within 0.005 of full on every seed; rank 8: 0.05 below on Pass@64
        _kept(tmp_path, "lora1", seed, p1 + 0.005 * (-1) ** seed, p64 + 0.003)
        _kept(tmp_path, "lora8", seed, p1, p64 - 0.05 - 0.002 * seed)
    for seed in range(3):  # rank 32: 3 of 5 seeds, learning nothing
        _kept(tmp_path, "lora32", seed, 0.17, 0.50)
    text = lora_study.report(str(tmp_path))

    assert "Not the study yet" in text  # rank 32 has 3 of its 5 seeds
    assert "lora1 0.0003, lora8 0.001, lora32 0.0001" in text  # the pilot's rates
    rows = {
        line.split(" | ")[1]: line for line in _lines(text, "lora1") if "arm - full" not in line
    }
    assert rows["Pass@1"].endswith("| held |")
    assert rows["Pass@64"].endswith("| held |")
    assert rows["Pass@8"].endswith("| (not predicted) |")
    eight = {line.split(" | ")[1]: line for line in _lines(text, "lora8")}
    assert eight["Pass@64"].endswith("| against |")  # -0.054 [-0.056, -0.052]: outside 0.02
    assert "-0.054 [" in eight["Pass@64"]
    thirty_two = [line for line in _lines(text, "lora32") if "| Pass@" in line]
    assert sum("not judged (3 of 5" in line for line in thirty_two) == 2  # Pass@1, Pass@64
    # the mechanism check: full gains 0.038 over the base's 0.17; rank 32's 3 seeds, unjudged
    gains = [line for line in text.splitlines() if line.count("|") == 4]
    assert any(line.startswith("| full | 0.038 [") and "| held |" in line for line in gains)
    assert any(
        line.startswith("| lora32 | 0.000 [") and "not judged (3 of 5" in line for line in gains
    )


def test_no_report_without_runs_and_no_arm_without_the_pilot(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="no finished LoRA study run"):
        lora_study.report(str(tmp_path))
    monkeypatch.setattr(lora_study, "CHOSEN", str(tmp_path / "none.json"))
    assert lora_study.chosen_lr("full") == lora_study.FULL_LR
    with pytest.raises(SystemExit, match="run --pilot first"):
        lora_study.chosen_lr("lora8")


def test_the_numbers_docs_quote_are_the_reports():
    """docs/lab.md's LoRA result quotes results/lab/lora_study.md, which the script writes
    from the kept runs: every decimal number in it is one of the report's."""
    import re

    with open(os.path.join(HERE, "..", "docs", "lab.md")) as f:
        docs = f.read()
    section = docs.split("## LoRA against full fine-tuning", 1)[1].split("\n## ", 1)[0]
    result = section.split("**Result**", 1)[1]
    with open(os.path.join(HERE, "..", "results", "lab", "lora_study.md")) as f:
        report = f.read()
    number = re.compile(r"-?\d+\.\d+")
    quoted = set(number.findall(result))
    assert quoted and quoted <= set(number.findall(report)), quoted - set(number.findall(report))
