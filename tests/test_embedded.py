"""The embedded SmolLM2 GGUF: our loader and tokenizer vs transformers' GGUF loading."""

import os

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_float32_close

from explore_rl.models.transformer import forward, positions_from_mask
from explore_rl.sampling.sampler import greedy
from explore_rl.sampling.shapes import left_pad

# the real 135M model and transformers' GGUF loader
pytestmark = [
    pytest.mark.slow,
    pytest.mark.optimized,
    pytest.mark.usefixtures("highest_precision"),
    pytest.mark.numerics,
]

TEXTS = [
    "Hello world",
    "What is 23 + 58?  Answer\n\nwith 1234567 numbers.",
    " leading space, trailing space ",
    "ünïcödé 日本語 🙂 — “quotes”",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "tabs\tand   spaces\r\n\\boxed{\\frac{1}{2}}",
]
QUESTIONS = [
    "What is 7 + 5?",
    "Tom has 3 apples and buys 4 more. How many apples does he have?",
    "Name the capital of France.",
]


@pytest.fixture(scope="module")
def hf_gguf(embedded_gguf):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(embedded_gguf)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return tok, model.eval()


def test_tokenizer_ids_match_transformers(embedded_model, hf_gguf):
    _, _, ours = embedded_model
    ref, _ = hf_gguf
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False), text
        assert ours.decode(ids, skip_special_tokens=False) == text
    msgs = [{"role": "user", "content": QUESTIONS[1]}]
    assert ours.apply_chat_template(msgs) == ref.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True
    )
    assert (ours.bos_id, ours.eos_id, ours.pad_id) == (
        ref.bos_token_id,
        ref.eos_token_id,
        ref.pad_token_id,
    )
    assert ours.vocab_size == len(ref)


def _prompts(tok):
    return [tok.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS] + [
        tok.encode("The capital of France is Paris. It is known for the Eiffel Tower, which")
    ]


def test_logits_match_transformers(embedded_model, hf_gguf):
    import torch

    params, cfg, tok = embedded_model
    _, model = hf_gguf
    rows = _prompts(tok)
    tokens, mask = left_pad(rows, tok.pad_id)
    ours = np.asarray(forward(params, cfg, tokens, positions_from_mask(mask), mask).logits)
    for i, row in enumerate(rows):
        with torch.no_grad():
            ref = model(torch.tensor([row])).logits[0].numpy()
        # 30 layers and a 49k vocabulary in another library's kernels and summation orders
        assert_float32_close(ours[i, -len(row) :], ref, ulps=1024, err_msg=f"row {i}")


def test_greedy_continuations_match_transformers(embedded_model, hf_gguf):
    import torch

    params, cfg, tok = embedded_model
    _, model = hf_gguf
    rows = _prompts(tok)
    tokens, mask = left_pad(rows, tok.pad_id)
    gen = greedy(params, cfg, tokens, mask, max_new_tokens=20, stop_ids=tok.stop_ids)
    for i, row in enumerate(rows):
        with torch.no_grad():
            ref = model.generate(
                torch.tensor([row]),
                max_new_tokens=20,
                do_sample=False,
                eos_token_id=list(tok.stop_ids),
                pad_token_id=tok.pad_id,
            )
        ref_new = ref[0, len(row) :].tolist()
        ours = np.asarray(gen.tokens[i])[np.asarray(gen.mask[i])].tolist()
        assert ours == ref_new, (tok.decode(ours), tok.decode(ref_new))
    assert int(jnp.sum(gen.mask)) > 20  # real continuations, not immediate stops
