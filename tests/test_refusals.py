"""Every way a command can be wrong, through the entry point's one error boundary: exit
status 2, exactly one `error:` line naming the setting or file, and a run directory it
was pointed at left byte for byte as it was. The cases that fail before any file is read
run the entry point in this process; those that reach the data, the weights or the
checkpoints are `slow` (a run's set-up each), and a few run as the real command."""

import json
import os
import shutil
import sys

import jax
import jax.numpy as jnp
import pytest
from absl import flags
from helpers import make_hf_checkpoint, run_main, snapshot

from configs import grpo
from explore_rl import checkpoint as checkpoint_lib
from explore_rl import config as config_lib
from explore_rl import main, stages
from explore_rl.logs import read_metrics
from explore_rl.spec import DOMAINS
from explore_rl.train import loop

SMOKE = ["--config", "configs/grpo.py:smoke"]


def _bad_value(key: str) -> str:
    """A value outside `key`'s domain, as the command line writes it: below an integer
    domain's least value, a float domain's non-finite one."""
    d = DOMAINS[key]
    if d.integer:
        return str(int(d.low) - 1 if not d.special or d.special[0] != int(d.low) - 1 else -2)
    return "nan"


# (what is wrong, its arguments besides SMOKE and --workdir, the words its line has)
DOMAIN_CASES = [(f"domain of {k}", [f"--config.{k}={_bad_value(k)}"], f"{k}=") for k in DOMAINS]
CONFIG_CASES = [
    ("seed below 0", ["--config.seed=-1"], "seed=-1: must be an integer in [0, "),
    ("learning rate inf", ["--config.optim.lr=inf"], "optim.lr=inf: must be a finite number > 0"),
    ("grad norm nan", ["--config.optim.max_grad_norm=nan"], "optim.max_grad_norm=nan"),
    ("adam b2 nan", ["--config.optim.b2=nan"], "optim.b2=nan: must be a finite number in [0, 1)"),
    ("eps_low nan", ["--config.rl.eps_low=nan"], "rl.eps_low=nan"),
    ("format weight nan", ["--config.reward.format_weight=nan"], "reward.format_weight=nan"),
    ("temperature inf", ["--config.rollout.temperature=inf"], "rollout.temperature=inf"),
    ("swept temperature", ["--config.eval.temperatures=0.7,hot"],
     "eval.temperatures='0.7,hot': 'hot' must be a finite number >= 0; or give 'rollout'"),
    ("negative KL", ["--config.rl.kl_coef=-1.0"], "rl.kl_coef=-1.0: must be a finite number >= 0"),
    ("timeout inf", ["--config.reward.timeout=inf"], "reward.timeout=inf"),
    ("top_k huge", [f"--config.rollout.top_k={10**12}"], f"rollout.top_k={10**12}: must be"),
    ("methods a number", ["--config.exploration.methods=0.5"], "exploration.methods=(0.5,)"),
    ("a method's float nan", ["--config=configs/ead.py:smoke", "--config.exploration.ead.d0=nan"],
     "exploration.ead.d0=nan"),
    ("score temperature inf", ["--config.rl.score_temperature=inf"], "rl.score_temperature='inf'"),
    ("sft batch of none", ["--mode=sft", "--config.sft.batch_size=0"], "sft.batch_size=0"),
    ("test set of none", ["--config.task.test_size=0"], "task.test_size=0"),
    ("group of one", ["--config.rollout.group_size=1"], "rollout.group_size=1: GRPO needs"),
    ("micro-batches", ["--config.optim.micro_batches=3"], "optim.micro_batches=3 must divide"),
    ("minibatches", ["--config.rl.minibatches=3"], "rl.minibatches=3 must divide"),
    ("aggregation", ["--config.rl.aggregation=mean"], "aggregation='mean'"),
    ("mesh", ["--config.mesh.data=3"], "mesh.data=3: must divide the"),
    ("tensor axis", ["--config.mesh.tensor=2"], "mesh.tensor=2: mesh.data x mesh.tensor must"),
    ("gspo aggregation", ["--config.rl.policy=gspo"], "policy='gspo' is a sequence-level"),
    ("dual clip", ["--config.rl.dual_clip=0.5"], "dual_clip=0.5: must be > 1"),
    ("score temperature", ["--config.rl.score_temperature=hot"], "rl.score_temperature='hot'"),
    ("preset", ["--config.task.preset=gsm9k"], "task.preset='gsm9k': allowed"),
    ("long prompts", ["--config.task.long_prompts=drop"], "task.long_prompts='drop'"),
    ("template kwargs", ["--config.task.template_kwargs={x}"], "task.template_kwargs='{x}'"),
    ("raw prompt", ["--config.task.raw_prompt=Q:"], "task.raw_prompt='Q:': must contain"),
    ("reward name", ["--config.reward.name=chess"], "reward.name='chess'"),
    ("reward module", ["--config.reward.fn=no_such_mod:f"], "cannot import no_such_mod"),
    ("reward a lambda", ["--config.reward.fn=test_refusals:lambda_reward"],
     "reward.fn='test_refusals:lambda_reward': cannot be sent to the reward workers"),
    ("extractor", ["--config.reward.extractors=boxed,vibes"], "reward.extractors has 'vibes'"),
    ("composed", ["--config.exploration.methods=('eden','ead')"], "rl.tis_cap"),
    ("method name", ["--config.exploration.methods=('edenn',)"], "edenn"),
    ("model path", ["--config.model.path=/no/model"], "model.path=/no/model: no such file"),
    ("train path", ["--config.task.train_path=/no/d.jsonl"], "task.train_path=/no/d.jsonl"),
    ("eval checkpoint", ["--config.eval.checkpoint=/no/run"], "eval.checkpoint=/no/run: no such"),
    ("prompt file", ["--config.sample.prompt_file=/no/p.txt"], "sample.prompt_file=/no/p.txt"),
    ("unknown field", ["--config.rollout.tempreature=1"], "--config.rollout.tempreature: no such"),
    ("not a boolean", ["--config.train.prune_checkpoints=maybe"], "prune_checkpoints=maybe"),
    ("unknown mode", ["--mode=serve"], "--mode=serve"),
    ("config syntax", ["--config={tmp}/syntax.py"], "syntax.py"),
    ("config file missing", ["--config=/no/config.py"], "/no/config.py"),
    ("config raises", ["--config={tmp}/raises.py"], "raises.py"),
    ("config argument", ["--config=configs/grpo.py:huge"], "grpo.py:huge"),
]  # fmt: skip


lambda_reward = lambda response, problem: 0.0  # noqa: E731 - a lambda does not pickle


def _config_files(tmp):
    (tmp / "syntax.py").write_text("def get_config(:\n")
    (tmp / "raises.py").write_text("def get_config():\n    return {}['seed']\n")


def _entry(args: list[str], capsys, monkeypatch) -> tuple[int, list[str]]:
    """The exit status and the `error:` lines of `python -m explore_rl.main ARGS`, run in
    this process (flags parsed from nothing before; the config flag reads its overrides
    from sys.argv)."""
    flags.FLAGS.unparse_flags()
    for name in [n for n in flags.FLAGS if n.startswith("config.")]:  # the last command's
        delattr(flags.FLAGS, name)  # overrides, which the config flag defines as flags
    argv = config_lib.config_argv(["explore_rl.main", *args])
    monkeypatch.setattr(sys, "argv", argv)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main.main(main.parse_flags(argv))
    err = capsys.readouterr().err
    return stopped.value.code, [line for line in err.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def victim(tmp_path_factory):
    """A finished one-step smoke run that each refused command is pointed at."""
    folder = tmp_path_factory.mktemp("victim")
    c = grpo.get_config("smoke")
    c.train.steps, c.train.eval_every = 1, 0
    loop.train(config_lib.spec(c), str(folder))
    return folder


def _one_line(code: int, lines: list[str], words: str) -> None:
    """Exit status 2 and one `error:` line with `words`; a library's error keeps its
    traceback in the file the line names."""
    assert code == 2 and len(lines) == 1, lines
    assert words in lines[0], lines[0]
    if "its trace: " in lines[0]:
        path = lines[0].rsplit("its trace: ", 1)[1].rstrip(")")
        with open(path) as f:
            assert "Traceback (most recent call last)" in f.read()
        os.remove(path)


def _refused(args, words, folder, capsys, monkeypatch):
    before = snapshot(folder)
    code, lines = _entry([*args, "--workdir", str(folder)], capsys, monkeypatch)
    _one_line(code, lines, words)
    assert snapshot(folder) == before
    return lines[0]


@pytest.mark.parametrize("what,args,words", DOMAIN_CASES + CONFIG_CASES)
def test_a_bad_setting_is_one_line_naming_it(
    what, args, words, victim, tmp_path, capsys, monkeypatch
):
    _config_files(tmp_path)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    config = [] if any(a.startswith("--config=") for a in args) else SMOKE
    words = words.replace("{tmp}", str(tmp_path))
    _refused([*config, *args], words, victim, capsys, monkeypatch)


def test_every_numeric_setting_has_a_domain():
    """A number the config holds (but a method's or a task's own, which their checks
    cover) has its domain declared: a new field cannot go unchecked."""
    from explore_rl.logs import flatten

    numbers = {
        k for k, v in flatten(grpo.get_config("smoke").to_dict()).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }  # fmt: skip
    assert numbers - DOMAINS.keys() == set()


def _copy(victim, tmp):
    shutil.copytree(victim, tmp / "run")
    return tmp / "run"


def _truncated_config(victim, tmp):
    run = _copy(victim, tmp)
    text = (run / "config.json").read_text()
    (run / "config.json").write_text(text[: len(text) // 2])
    return ["--config.train.allow_config_change=False"], run, "config.json: JSONDecodeError: "


def _garbage_best(victim, tmp):
    run = _copy(victim, tmp)
    (run / "checkpoints" / "best.json").write_text("{not json")
    args = ["--config.train.best_metric=eval/arithmetic/mean@2", "--config.train.eval_every=1"]
    return args, run, "checkpoints/best.json: not a best checkpoint's record"


def _garbage_state(victim, tmp):
    (tmp / "ds").mkdir()
    (tmp / "ds" / "state.json").write_text("[1, 2")
    return [f"--config.task.train_path={tmp / 'ds'}"], victim, f"reading {tmp / 'ds'}: "


def _corrupt_parquet(victim, tmp):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp / "train.parquet"
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(200)]
    pq.write_table(pa.Table.from_pylist(rows), path, compression="snappy")
    data = bytearray(path.read_bytes())
    data[64:160] = b"\xa5" * 96  # inside the first column's data page
    path.write_bytes(bytes(data))
    return [f"--config.task.train_path={path}"], victim, f"reading {path}: "


def _export_into_a_file(victim, tmp):
    (tmp / "file").write_text("mine")
    args = ["--mode=export", f"--config.eval.checkpoint={victim}"]
    return args + [f"--workdir={tmp / 'file'}"], tmp, f"--workdir {tmp / 'file'}: a file"


def _no_workdir(victim, tmp):
    return ["--workdir="], victim, "--mode train needs --workdir"


def _data_file(name, content, words):
    def prepare(victim, tmp):
        (tmp / name).write_text(content)
        return [f"--config.task.train_path={tmp / name}"], victim, words

    return prepare


def _model(change: dict, tokenizer: bool, words: str):
    """A tiny HF folder whose config.json has `change`, with the embedded tokenizer."""

    def prepare(victim, tmp):
        from explore_rl.models import weights

        make_hf_checkpoint(tmp / "m", "llama")
        hf = json.loads((tmp / "m" / "config.json").read_text())
        (tmp / "m" / "config.json").write_text(json.dumps({**hf, **change}))
        if tokenizer:
            for name in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(os.path.join(weights.model_folder("embedded"), name), tmp / "m" / name)
        return [f"--config.model.path={tmp / 'm'}", "--config.model.random_init="], victim, words

    return prepare


# (what is wrong, how to make it: (victim, tmp) -> (arguments, the folder that must not
# change, the words of its line)); each is resumed with train.allow_config_change, so the
# refusal comes from the file itself
SETUP_CASES = [
    ("config.json truncated", _truncated_config),
    ("best.json garbage", _garbage_best),
    ("datasets state.json garbage", _garbage_state),
    ("corrupt Parquet page", _corrupt_parquet),
    ("export into a file", _export_into_a_file),
    ("train without a workdir", _no_workdir),
    ("all rows malformed", _data_file("m.jsonl", '{"question": "1+1"\n{"q"\n', "no usable rows")),
    ("field missing", _data_file("f.jsonl", '{"problem": "1+1", "answer": "2"}\n', "no field")),
    ("weights vs config", _model({"intermediate_size": 128, "vocab_size": 49152}, True,
                                 "checkpoint and config do not match")),
    ("tokenizer vs vocab", _model({}, True, "tokenizer has 49152 tokens, the model")),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("what,prepare", SETUP_CASES)
def test_a_bad_file_is_one_line_naming_it(what, prepare, victim, tmp_path, capsys, monkeypatch):
    args, folder, words = prepare(victim, tmp_path)
    workdir = [] if any(a.startswith("--workdir") for a in args) else ["--workdir", str(folder)]
    before = snapshot(folder)
    code, lines = _entry(
        [*SMOKE, "--config.train.allow_config_change=True", *args, *workdir], capsys, monkeypatch
    )
    _one_line(code, lines, words)
    assert snapshot(folder) == before


def _damage(step_folder) -> None:
    """64 bytes overwritten in the middle of the step's largest file."""
    largest = max(
        (p for p in step_folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
    )
    data = bytearray(largest.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64
    largest.write_bytes(bytes(data))


def _outside_checkpoints(folder) -> dict:
    return {k: v for k, v in snapshot(folder).items() if not k.startswith("checkpoints")}


@pytest.mark.slow
def test_a_run_whose_every_checkpoint_is_damaged_is_refused_not_replaced(
    victim, tmp_path, capsys, monkeypatch
):
    """Its steps are set aside (one line each), then the resume is refused: metrics.jsonl,
    samples/ and config.json stay as they were, and a rerun is refused again; with
    `train.restart` they are moved beside it and a new run starts."""
    run = _copy(victim, tmp_path)
    _damage(run / "checkpoints" / "1")
    kept = _outside_checkpoints(run)
    for _ in range(2):
        code, lines = _entry([*SMOKE, "--workdir", str(run)], capsys, monkeypatch)
        _one_line(code, lines, f"--workdir {run}: no checkpoint in {run / 'checkpoints'} can be")
        assert "use a new --workdir, or --config.train.restart=True to move" in lines[0]
        assert _outside_checkpoints(run) == kept
    assert (run / "checkpoints" / "1.damaged").is_dir()  # kept for inspection
    c = grpo.get_config("smoke")  # asked: the files moved aside whole, a new run
    c.train.steps, c.train.eval_every, c.train.restart = 1, 0, True
    loop.train(config_lib.spec(c), str(run))
    aside = tmp_path / "run.replaced"
    assert _outside_checkpoints(aside) == {k: v for k, v in kept.items() if k != ".lock"}
    assert (aside / "checkpoints" / "1.damaged").is_dir()
    assert [r["step"] for r in read_metrics(str(run))] == [1]


@pytest.mark.slow
def test_checkpoints_that_are_a_file_are_refused_and_the_process_exits(victim, tmp_path):
    """The command ends (a timeout fails the test on a hang: Orbax's threads are not
    daemons) with one line, and the run directory is as it was."""
    run = tmp_path / "run"
    shutil.copytree(victim, run, ignore=shutil.ignore_patterns("checkpoints"))
    (run / "checkpoints").write_text("not a folder")
    before = snapshot(run)
    out = run_main(*SMOKE, "--workdir", str(run), timeout=300)
    lines = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    _one_line(out.returncode, lines, f"--workdir {run}: {run / 'checkpoints'} is not a folder")
    assert snapshot(run) == before


@pytest.mark.slow
def test_a_run_that_lost_its_config_is_not_resumed_as_another(
    victim, tmp_path, capsys, monkeypatch
):
    run = _copy(victim, tmp_path)
    (run / "config.json").unlink()
    before = snapshot(run)
    code, lines = _entry([*SMOKE, "--config.seed=7", "--workdir", str(run)], capsys, monkeypatch)
    _one_line(code, lines, f"--workdir {run}: its config.json is missing")
    assert snapshot(run) == before


def _train(folder, steps: int) -> None:
    c = grpo.get_config("smoke")
    c.train.steps, c.train.eval_every = steps, 0
    loop.train(config_lib.spec(c), str(folder))


@pytest.mark.slow
def test_a_step_without_its_digest_is_set_aside_or_restored_and_never_certified(
    victim, tmp_path, capsys
):
    """Beside an older digested step, a step without its digest (here also damaged) is set
    aside and the run resumes before it; a run's only step without one is restored as
    Orbax reads it, said in one line, and stays without a digest (a digest vouches only
    for a write seen to finish)."""
    run = _copy(victim, tmp_path)
    _train(run, 2)
    folder = run / "checkpoints"
    (folder / "2.sha256").unlink()
    _damage(folder / "2")
    capsys.readouterr()
    _train(run, 3)
    said = [line for line in capsys.readouterr().err.splitlines() if "checkpoint 2" in line]
    assert len(said) == 1 and "is damaged (no digest, and step 1 before it has one)" in said[0]
    assert [r["step"] for r in read_metrics(str(run))] == [1, 2, 3]
    assert not (folder / "2.damaged.sha256").exists()
    assert checkpoint_lib.check_digest(str(folder), 2) is None  # the step written again
    only = _copy(victim, tmp_path / "only")
    (only / "checkpoints" / "1.sha256").unlink()
    _train(only, 2)
    err = capsys.readouterr().err
    assert "has no digest (the run stopped before it was written): restored as Orbax" in err
    folder = str(only / "checkpoints")
    assert checkpoint_lib.check_digest(folder, 1) == checkpoint_lib.NO_DIGEST
    assert checkpoint_lib.check_digest(folder, 2) is None


@pytest.mark.slow
def test_non_finite_weights_stop_the_run_before_they_are_checkpointed(tmp_path):
    """Weights that turn non-finite in an update (here: made NaN after step 2's) stop the
    run with one line instead of being checkpointed; the newest checkpoint is the step
    before, intact."""
    c = grpo.get_config("smoke")
    c.train.steps, c.train.eval_every, c.train.checkpoint_every = 3, 0, 1
    spec = config_lib.spec(c)

    def poisoned(run, progress, step):
        progress, metrics, samples = loop.rl_step(run, progress, step)
        if step == 1:
            params = jax.tree.map(lambda x: x * jnp.nan, progress.state.params)
            progress = progress.replace(state=progress.state.replace(params=params))
        return progress, metrics, samples

    from explore_rl.exploration import base as exploration

    with pytest.raises(stages.Stopped, match=r"^the weights are not finite at step 2: not "
                       r"checkpointed \(the newest checkpoint, step 1, is intact\)"):  # fmt: skip
        loop.run(spec, exploration.build(spec), str(tmp_path), poisoned)
    assert checkpoint_lib.steps(str(tmp_path / "checkpoints")) == [1]
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2]  # what step 2 logged


@pytest.mark.slow
def test_a_refused_new_work_directory_leaves_nothing_behind(tmp_path, capsys, monkeypatch):
    """Refused at the data, after the lock and the checkpoints folder were made."""
    (tmp_path / "bad.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
    new = tmp_path / "new"
    args = [*SMOKE, f"--config.task.train_path={tmp_path / 'bad.jsonl'}", "--workdir", str(new)]
    code, lines = _entry(args, capsys, monkeypatch)
    _one_line(code, lines, "no field")
    assert not new.exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,words",
    [
        (["--mode=serve"], "error: flag --mode=serve: value should be one of"),
        (["--config.reward.fn=lambdas:reward"], "cannot be sent to the reward workers"),
    ],
)
def test_the_command_itself_refuses_in_one_line(args, words, tmp_path):
    """As the real command: no traceback, nothing made (a reward written as a lambda is
    found before the model loads, not at the first scoring)."""
    (tmp_path / "lambdas.py").write_text("reward = lambda response, problem: 0.0\n")
    out = run_main(*SMOKE, *args, "--workdir", str(tmp_path / "run"), cwd=tmp_path, timeout=300)
    lines = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    _one_line(out.returncode, lines, words)
    assert "Traceback" not in out.stderr and not (tmp_path / "run").exists()


def test_history_is_a_step_once_written_not_an_unfinished_write(tmp_path):
    """A run killed inside its first checkpoint's write (Orbax's temporary folder) has no
    history to lose and reruns; a step set aside, a digest or a best record is history."""
    folder = tmp_path / "checkpoints"
    (folder / "1.orbax-checkpoint-tmp-1733").mkdir(parents=True)
    checkpoint_lib.check_history(str(tmp_path), restorable=False)
    for name in ("1.damaged", "1.damaged.2", "2.sha256", "best.json"):
        (folder / name).mkdir()
        with pytest.raises(checkpoint_lib.History, match=rf"can be restored \({name}"):
            checkpoint_lib.check_history(str(tmp_path), restorable=False)
        (folder / name).rmdir()
