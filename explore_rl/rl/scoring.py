"""Scoring rollouts: their log-probs and entropies under a policy, and a block's readout.

Rollouts are scored with the group-shared prompt: each of the Q prompts runs forward once
and its keys become the shared prefix of its G responses (`KVCache.prefix_*`), so the
prompt costs one forward, and its gradient is the sum over the group. The log-prob of
response token t comes from the hidden state before it: the prompt's last position for
t = 0, response position t - 1 after. The update (`train_step`) differentiates `score`;
ASE and ExTra read hidden states with `readout`.

Dimension letters: Q prompts, G rollouts per prompt, B = Q x G rows, L prompt length,
T response length, D model.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from explore_rl.models import transformer
from explore_rl.models.presets import ModelConfig
from explore_rl.sampling import sampler, shapes


def _continue_prompts(params, cfg, prompts, prompt_mask, inputs, mask, interventions=None):
    """The decoder over Q prompts (one forward each, as the sampler prefills them) and
    the B = Q x G rows continuing them (row b after prompt b // G, its keys read from the
    shared prefix): (each prompt's last hidden state [Q, D], the rows' output), no logits."""
    q, (b, t) = prompts.shape[0], inputs.shape
    prompt_mask = prompt_mask.astype(bool)
    rows = shapes.grouped_rows(q, b)
    prefix, last = sampler.prefill_prompts(params, cfg, prompts, prompt_mask, interventions, rows)
    start = jnp.repeat(jnp.sum(prompt_mask, axis=1), b // q)[:, None]
    cache = transformer.init_cache(cfg, b, t, prefix=prefix)
    out = transformer.hidden_states(
        params, cfg, inputs, start + jnp.arange(t)[None], mask.astype(bool), cache, interventions
    )
    return last, out


def score(params: dict, cfg: ModelConfig, prompts, prompt_mask, tokens, mask, temperature=1.0):
    """log pi(token) and the entropy of pi at each response position, [B, T] each, pi =
    softmax(logits / temperature) (the score temperature: `LossConfig.score_temperature`).
    No [B, T, V] logits are held (`transformer.token_logprobs`)."""
    g = tokens.shape[0] // prompts.shape[0]
    last, out = _continue_prompts(params, cfg, prompts, prompt_mask, tokens[:, :-1], mask[:, :-1])
    first = jnp.repeat(last[:, None], g, axis=0)
    hidden = jnp.concatenate([first, out.hidden], axis=1)
    return transformer.token_logprobs(params, cfg, hidden, tokens, temperature)


def readout(params: dict, cfg: ModelConfig, prompts, prompt_mask, tokens, mask, layer: int):
    """Block `layer`'s output at each response token, [B, T, D]: the scoring pass above
    with response token t as the input at its position, unsteered, stopped after that
    block (the blocks above it are not run)."""
    below = {**params, "layers": params["layers"][: layer + 1]}
    cut = dataclasses.replace(cfg, n_layers=layer + 1)
    iv = transformer.Interventions(readout_layer=layer)
    return _continue_prompts(below, cut, prompts, prompt_mask, tokens, mask, iv)[1].readout
