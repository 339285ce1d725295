"""EDEN's "diversity appears before any update" (EDEN paper): for each held-out prompt, G
standard rollouts of the initial policy, G with the prompt's anchor + per-row noise
appended, and G more standard ones (the null: two standard sets differ by chance too),
all at temperature 1; their correct responses compared by `evaluation.diversity`.

    python -m explore_rl.eden_analysis --config configs/eden.py:demo --prompts 32
"""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from explore_rl import config as config_lib
from explore_rl.evaluation.diversity import summarise
from explore_rl.exploration import base, eden
from explore_rl.models.transformer import Interventions
from explore_rl.rl import rollout as rollout_lib
from explore_rl.rl.plan import RolloutPlan
from explore_rl.sampling.engine import AUTO
from explore_rl.spec import replace


def analyse(c, prompts: int, samples: int) -> dict:
    """Sample the three sides with the initial policy and compare them."""
    spec = config_lib.spec(c)
    params, cfg, tok = spec.model.load(spec.seed)
    spec = spec.with_stop_ids(tok.stop_ids)
    if spec.rollout.engine.slots == AUTO:  # a few prompts at a time: every row at once
        spec = replace(spec, **{"rollout.engine.slots": 0})
    train_set, tests = spec.problems()
    problems = next(iter(tests.values()))[:prompts]
    ex = next((e for e in base.build(spec) if e.name == "eden"), None)
    if ex is None:
        raise ValueError("diversity: the config has no 'eden' in exploration.methods")
    out = {"standard": [], "null": [], "perturbed": []}
    with spec.reward.verifier() as verifier:
        ctx = base.StepContext(params, cfg, tok, spec, 0, train_set, verifier)
        bank = ex.init(ctx)
        key = jax.random.key(spec.seed)
        for start in range(0, len(problems), 8):
            chunk = problems[start : start + 8]
            key, k_side, k_null, k_anchor, k_noise = jax.random.split(key, 5)
            b = len(chunk) * samples
            anchor = jax.random.randint(k_anchor, (len(chunk),), 0, bank["ids"].shape[0])
            a = jnp.repeat(bank["vectors"][anchor], samples, axis=0)
            slot = a + eden.noise(k_noise, a, ex.settings.rho)
            iv = Interventions(extra_embeds=slot[:, None], extra_mask=jnp.ones((b, 1), bool))
            sides = (("standard", None, k_side), ("null", None, k_null), ("perturbed", iv, k_side))
            for side, interventions, k in sides:
                tau = jnp.ones((b, spec.rollout.sampling.max_new_tokens))
                plan = RolloutPlan(tau, interventions, problems=chunk)
                ro = rollout_lib.generate(params, cfg, tok, plan, k, verifier, **spec.generation())
                out[side] += _responses(ro, samples)
    return summarise(out["standard"], out["null"], out["perturbed"])


def _responses(ro, samples: int) -> list[tuple[list, list]]:
    """Per prompt: (all responses, correct ones) as token-id lists."""
    tokens, mask = np.asarray(ro.out.tokens), np.asarray(ro.out.mask)
    rows = [t[m].tolist() for t, m in zip(tokens, mask)]
    correct = ro.correct.reshape(-1)
    return [
        (rows[i : i + samples], [r for r, ok in zip(rows[i : i + samples], correct[i:]) if ok])
        for i in range(0, len(rows), samples)
    ]


def main(argv):
    del argv
    result = analyse(_CONFIG.value, _PROMPTS.value, _SAMPLES.value)
    print(json.dumps(result, indent=2))
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":  # flags only here: importing the functions defines none
    _CONFIG = config_flags.DEFINE_config_file("config", None, "An EDEN config.")
    _PROMPTS = flags.DEFINE_integer("prompts", 32, "Held-out questions analysed.")
    _SAMPLES = flags.DEFINE_integer("samples", 16, "Rollouts per question and side.")
    _OUT = flags.DEFINE_string("out", "", "Write the numbers as JSON here too.")
    app.run(main, argv=config_lib.config_argv(sys.argv))
