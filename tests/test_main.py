"""The command line: `python -m explore_rl.main --mode sample` end to end."""

import json
import re

import pytest
from helpers import run_main


@pytest.mark.slow  # the command line, loading the embedded model
def test_sample_mode_writes_samples(tmp_path):
    """On a mesh of two (fake) devices: the rows are decoded over both."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"question": "What is 2 + 2?"}\n{"question": "What is 3 + 5?"}\n')
    out = run_main(
        "--mode",
        "sample",
        "--config",
        "configs/base.py",
        "--workdir",
        str(tmp_path / "run"),
        "--config.sample.prompt_file",
        str(prompts),
        "--config.sample.samples_per_prompt=3",
        "--config.sample.temperature=1.0",
        "--config.sample.max_new_tokens=8",
        devices=2,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(x) for x in open(tmp_path / "run" / "samples" / "sample.jsonl")]
    assert [r["prompt"] for r in rows] == ["What is 2 + 2?"] * 3 + ["What is 3 + 5?"] * 3
    assert all(r["response"] for r in rows)
    assert json.load(open(tmp_path / "run" / "config.json"))["sample"]["temperature"] == 1.0


@pytest.mark.slow  # the command line, loading the embedded model
def test_bad_config_and_prompt_field_fail_clearly(tmp_path):
    out = run_main(
        "--mode", "sample", "--config", "configs/base.py", "--config.sample.no_such_key=1"
    )
    assert out.returncode != 0 and "no_such_key" in out.stderr
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"problem": "1 + 1"}\n')
    out = run_main(
        "--mode",
        "sample",
        "--config",
        "configs/base.py",
        "--config.sample.prompt_file",
        str(prompts),
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr  # one line names it
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {prompts}: line 1: no field 'question' (fields: ['problem'])")
    out = run_main(  # a method's check, through the same line
        "--config", "configs/eden.py:smoke", "--workdir", str(tmp_path / "r"),
        "--config.exploration.eden.noisy=4", "--debug",
    )  # fmt: skip
    assert out.returncode != 0 and "Traceback" in out.stderr
    assert "exploration.eden.noisy=4: must be in [0, group_size=4)" in out.stderr


def test_sample_mode_honours_random_init(tmp_path, capsys):
    from configs import base
    from explore_rl import config as config_lib
    from explore_rl.modes import sample

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("What is 2 + 2?\n")
    c = base.get_config()
    c.model.random_init = "tiny-llama"  # the embedded tokenizer, random 2-layer weights
    c.sample.prompt_file, c.sample.samples_per_prompt, c.sample.max_new_tokens = (
        str(prompts),
        2,
        4,
    )
    samples = sample.run_sample(config_lib.spec(c), str(tmp_path / "run"))
    assert [s["prompt"] for s in samples] == ["What is 2 + 2?"] * 2
    out = capsys.readouterr().out
    assert "(llama, 2M params)" in out and "135M" not in out


@pytest.mark.parametrize(
    "key,value,words",
    [
        ("samples_per_prompt", 0, "sample.samples_per_prompt=0: must be an integer >= 1"),
        ("num_prompts", 0, "sample.num_prompts=0: must be an integer >= 1"),
        ("max_new_tokens", 0, r"sample.max_new_tokens=0: must be an integer in \[1, "),
        ("top_k", -1, r"sample.top_k=-1: must be an integer in \[0, 2147483647\] \(0: all\)"),
        ("temperature", -0.5, "sample.temperature=-0.5: must be a finite number >= 0"),
    ],
)
def test_sample_settings_are_checked_before_the_model_is_read(key, value, words, monkeypatch):
    from configs import base
    from explore_rl import config as config_lib
    from explore_rl.modes import sample

    c = base.get_config()
    c.sample[key] = value
    read = lambda *a: pytest.fail("the model was read")  # noqa: E731
    monkeypatch.setattr("explore_rl.models.weights.load", read)
    with pytest.raises(ValueError, match=f"^config: {words}"):
        sample.run_sample(config_lib.spec(c), None)


@pytest.mark.parametrize(
    "name,content,words",
    [
        ("p.jsonl", b'{"question": "1 + 1"}\n\n{"question": \n', ": line 3: not a JSON object"),
        ("p.jsonl", b'{"question": "1 + 1"}\n[1, 2]\n', ": line 2: not a JSON object"),
        ("p.jsonl", b'{"question": "1 + 1"}\n{"question": "\xff"}\n', ":2: not UTF-8 text"),
        ("p.txt", b"What is 1 + 1?\n\xff\n", ": not UTF-8 text (byte 15)"),
    ],
)
def test_a_bad_prompt_file_names_its_line_before_the_model_is_read(
    name, content, words, tmp_path, monkeypatch
):
    from configs import base
    from explore_rl import config as config_lib
    from explore_rl.modes import sample

    path = tmp_path / name
    path.write_bytes(content)
    c = base.get_config()
    c.sample.prompt_file = str(path)
    read = lambda *a: pytest.fail("the model was read")  # noqa: E731
    monkeypatch.setattr("explore_rl.models.weights.load", read)
    with pytest.raises(ValueError, match=f"^{path}{re.escape(words)}"):
        sample.run_sample(config_lib.spec(c), None)
