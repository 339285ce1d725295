"""Every command in README.md and docs/ runs: the documentation is a contract.

The commands are read from the pages themselves (their shell blocks) and run in order in one
fresh folder outside the clone, as a user would type them, each at the smallest size that
still does what it says (`smoke` below): a training command trains the same config at its
smoke scale, a sampling command draws a few tokens, a benchmark times a tiny random model of
the same code path, and a model folder a page only names is the embedded model's HF folder;
each compiles as the suite's tests do (`helpers.subprocess_env`). A Python block that
starts with a file name (`# my_rewards.py: ...`) is that file, written into the folder
first; the getting-started page's Python block runs as a script, fully optimised as the
notebooks that load the embedded SmolLM2-135M are (running it is the time). A command the
pages give twice runs once. `docs/adding_a_method.md`'s commands need its files inside the package:
`tests/test_adding_a_method.py` runs them in a copy of the project with the files placed.
`make test-all` is the command that runs this suite (`make test` its fast tier); `make demo`
is checked with `make -n` (its recipe resolves and runs `configs/grpo.py:demo`, trained here
at smoke scale)."""

import os
import re
import shlex
import subprocess
import sys

import pytest
from helpers import ROOT, page_blocks, smoke, subprocess_env

pytestmark = pytest.mark.slow

FILE_BLOCK = re.compile(r"# ([\w.]+\.py)\b")  # a Python block that is a file of that name


def page_commands() -> list[list[str]]:
    """The pages' shell commands, continuation lines joined, comments dropped, each once."""
    commands = []
    for block in page_blocks(""):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words not in commands:
                commands.append(words)
    return commands


def page_files() -> dict[str, str]:
    """The files the pages' Python blocks are, by name."""
    files = {}
    for block in page_blocks("python"):
        named = FILE_BLOCK.match(block)
        if named:
            assert named[1] not in files, f"two pages write {named[1]}"
            files[named[1]] = block
    return files


COMMANDS = page_commands()


def test_the_readme_has_its_commands():
    assert COMMANDS[0] == ["make", "demo"] and COMMANDS[1] == ["make", "test"]
    mains = [c for c in COMMANDS if c[:3] == ["python", "-m", "explore_rl.main"]]
    assert len(mains) >= 10 and any("--mode" in c for c in mains)


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory):
    """A folder outside the clone with the project's data/ and launch/ (the pages'
    relative paths), the files the pages' Python blocks are, and what the ones the pages
    run write (a data file: a command that trains on it passes when it runs alone too)."""
    folder = tmp_path_factory.mktemp("user")
    for name in ("data", "launch"):
        os.symlink(os.path.join(ROOT, name), folder / name)
    for name, text in page_files().items():
        (folder / name).write_text(text)
        if ["python", name] in COMMANDS:
            subprocess.run([sys.executable, name], cwd=folder, check=True)
    return folder


@pytest.fixture(scope="module")
def hf_folder():
    from explore_rl.models import weights

    return weights.gguf_as_hf_folder(weights.embedded_model_path())


# The comparison folder the report commands of docs/configs.md read: runs it trained, by name.
CMP = {"grpo-s0": "runs/demo", "ead-s0": "runs/ead", "eden-s0": "runs/eden"}


def _option(words: list[str], name: str) -> str | None:
    for i, w in enumerate(words):
        if w.startswith(name + "="):
            return w.split("=", 1)[1]
        if w == name and i + 1 < len(words):
            return words[i + 1]
    return None


def trains(words: list[str]) -> str | None:
    """The folder a command of the pages writes that another reads: a training or SFT run's
    directory, or an export's model folder (None for any other command)."""
    writers = (None, "train", "sft", "export")
    if words[1:3] != ["-m", "explore_rl.main"] or _option(words, "--mode") not in writers:
        return None
    return _option(words, "--workdir")


def reads(words: list[str]) -> list[str]:
    """The run directories a command of the pages reads: a checkpoint it evaluates or exports,
    a model or adapter folder it starts from, or the comparison folder's runs."""
    found = [
        _option(words, k)
        for k in ("--config.eval.checkpoint", "--config.model.path", "--config.model.lora.path")
    ]
    if "runs/cmp/*" in words:
        found += list(CMP.values())
    if words[1:3] == ["-m", "explore_rl.analysis"]:  # the run directories it compares
        found += [
            w
            for w in words
            if w.startswith("runs/") and "*" not in w and w != _option(words, "--out")
        ]
    return [r for r in found if r and r.startswith("runs/")]


def _run(words: list[str], user_folder, hf_folder):
    command = smoke(words, hf_folder)
    return command, subprocess.run(
        " ".join(shlex.quote(w) if "*" not in w else w for w in command),
        shell=True,  # the pages' globs expand as in the user's shell
        cwd=user_folder,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


def _check(command, done):
    report = f"{shlex.join(command)}\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, report


def _trained(run: str, user_folder, hf_folder) -> None:
    """A run `run` of the pages (e.g. runs/demo), trained by its own command unless
    an earlier command already did (and what that command reads, first): each command
    passes when it runs alone too."""
    if any((user_folder / run / n).exists() for n in ("config.json", "adapter_config.json")):
        return  # a run, a model folder or a PEFT adapter folder
    writer = next(c for c in COMMANDS if trains(c) == run)
    for earlier in reads(writer):
        _trained(earlier, user_folder, hf_folder)
    _check(*_run(writer, user_folder, hf_folder))


@pytest.mark.parametrize("words", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_the_readme_command_runs(words, user_folder, hf_folder):
    for run in reads(words):
        _trained(run, user_folder, hf_folder)
    cmp = user_folder / "runs" / "cmp"
    if "runs/cmp/*" in words and not cmp.exists():
        cmp.mkdir(parents=True)
        for name, run in CMP.items():
            os.symlink(user_folder / run, cmp / name)
    command, done = _run(words, user_folder, hf_folder)
    _check(command, done)
    if words[:2] == ["make", "demo"]:
        assert "configs/grpo.py:demo" in done.stdout


def test_every_run_a_readme_command_reads_is_trained_by_another():
    written = {trains(c) for c in COMMANDS} - {None}
    needed = {r for c in COMMANDS for r in reads(c)}
    assert needed and needed <= written, needed - written


CACHE = "from explore_rl import caching; caching.enable_compilation_cache()\n"  # as a notebook


def test_the_getting_started_python_runs(user_folder):
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            CACHE
            + page_blocks("python", ["docs/getting_started.md"])[0]
            + "\nprint(rollout.tokens.shape)",
        ],
        cwd=user_folder,
        env=subprocess_env(optimized=True),  # it runs the embedded 135M: running is the time
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("(8, 64)")
