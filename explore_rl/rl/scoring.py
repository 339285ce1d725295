"""Scoring rollouts: their log-probs and entropies under a policy, and a block's readout.

Rollouts are scored with the group-shared prompt: each of the Q prompts runs forward once
and its keys become the shared prefix of its G responses (`KVCache.prefix_*`), so the
prompt costs one forward, and its gradient is the sum over the group. The log-prob of
response token t comes from the hidden state before it: the prompt's last position for
t = 0, response position t - 1 after. The update (`train_step`) differentiates `score`;
ASE and ExTra read hidden states with `readout`.

Where full-sequence passes run the fused attention kernel (`attention.uses_fused`: a GPU
in bfloat16), which takes one key set a row, each row is instead laid out as one
contiguous prompt + response sequence: the prompt's compute is repeated once per row, for
a kernel that keeps no scores in memory (`models/attention.py` says when that pays).

Dimension letters: Q prompts, G rollouts per prompt, B = Q x G rows, L prompt length,
T response length, D model.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from explore_rl.models import attention, transformer
from explore_rl.models.presets import ModelConfig
from explore_rl.sampling import sampler, shapes


def _continue_prompts(params, cfg, prompts, prompt_mask, inputs, mask, interventions=None):
    """The decoder over Q prompts and the B = Q x G rows continuing them (row b after
    prompt b // G): (each row's prompt's last hidden state [B, D], the rows' output over
    `inputs`), no logits. Shared (one forward a prompt, its keys the rows' shared prefix)
    or, for the fused kernel, one contiguous sequence a row."""
    q, (b, t) = prompts.shape[0], inputs.shape
    prompt_mask, mask = prompt_mask.astype(bool), mask.astype(bool)
    start = jnp.repeat(jnp.sum(prompt_mask, axis=1), b // q)[:, None]
    positions = start + jnp.arange(t)[None]  # a response's, whatever its mask
    args = (params, cfg, prompts, prompt_mask, inputs, positions, mask, interventions)
    if attention.uses_fused(cfg.attention, cfg.jnp_dtype, cfg.head_dim):
        return _contiguous(*args)
    return _shared(*args)


def _shared(params, cfg, prompts, prompt_mask, inputs, positions, mask, interventions):
    """Each prompt once (as the sampler prefills it), its keys its rows' shared prefix."""
    q, b, t = prompts.shape[0], *inputs.shape
    rows = shapes.grouped_rows(q, b)
    prefix, last = sampler.prefill_prompts(params, cfg, prompts, prompt_mask, interventions, rows)
    cache = transformer.init_cache(cfg, b, t, prefix=prefix)
    out = transformer.hidden_states(params, cfg, inputs, positions, mask, cache, interventions)
    return jnp.repeat(last, b // q, axis=0), out


def _contiguous(params, cfg, prompts, prompt_mask, inputs, positions, mask, interventions):
    """Each row as its prompt (left-padded) then its inputs, one sequence, no cache."""
    each = lambda x: jnp.repeat(x, inputs.shape[0] // prompts.shape[0], axis=0)  # noqa: E731
    out = transformer.hidden_states(
        params, cfg, jnp.concatenate([each(prompts), inputs], axis=1),
        jnp.concatenate([each(transformer.positions_from_mask(prompt_mask)), positions], 1),
        jnp.concatenate([each(prompt_mask), mask], axis=1), None, interventions,
    )  # fmt: skip
    n = prompts.shape[1]
    response = lambda x: None if x is None else x[:, n:]  # noqa: E731
    return out.hidden[:, n - 1], out.replace(
        hidden=response(out.hidden), readout=response(out.readout)
    )


def score(params: dict, cfg: ModelConfig, prompts, prompt_mask, tokens, mask, temperature=1.0):
    """log pi(token) and the entropy of pi at each response position, [B, T] each, pi =
    softmax(logits / temperature) (the score temperature: `LossConfig.score_temperature`).
    No [B, T, V] logits are held (`transformer.token_logprobs`)."""
    last, out = _continue_prompts(params, cfg, prompts, prompt_mask, tokens[:, :-1], mask[:, :-1])
    hidden = jnp.concatenate([last[:, None], out.hidden], axis=1)
    return transformer.token_logprobs(params, cfg, hidden, tokens, temperature)


def readout(params: dict, cfg: ModelConfig, prompts, prompt_mask, tokens, mask, layer: int):
    """Block `layer`'s output at each response token, [B, T, D]: the scoring pass above
    with response token t as the input at its position, unsteered, stopped after that
    block (the blocks above it are not run)."""
    below = {**params, "layers": params["layers"][: layer + 1]}
    cut = dataclasses.replace(cfg, n_layers=layer + 1)
    iv = transformer.Interventions(readout_layer=layer)
    return _continue_prompts(below, cut, prompts, prompt_mask, tokens, mask, iv)[1].readout
