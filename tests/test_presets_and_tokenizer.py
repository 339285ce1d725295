"""Presets against published parameter counts; HF-folder tokenizers; full HF-folder loads."""

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import make_hf_checkpoint

from explore_rl.models import presets, weights
from explore_rl.models.tokenizer import Tokenizer

# Parameter counts from the model cards / safetensors metadata of each checkpoint.
PUBLISHED = {
    "smollm2-135m": 134_515_008,
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-math-1.5b": 1_543_714_304,
    "qwen2.5-math-7b": 7_615_616_512,
    "qwen3-1.7b": 1_720_574_976,
    "qwen3-8b": 8_190_735_360,
    "llama-3.2-1b": 1_235_814_400,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_counts(name):
    assert presets.get_preset(name).num_params() == PUBLISHED[name]


def test_preset_errors():
    with pytest.raises(ValueError, match="unknown model preset 'gpt-5'"):
        presets.get_preset("gpt-5")
    with pytest.raises(ValueError, match="dtype='float16'"):
        presets.get_preset("tiny-llama", dtype="float16")


@pytest.fixture(scope="module")
def hf_tokenizer_folder(tmp_path_factory, embedded_gguf):
    """The embedded tokenizer as transformers saves it: tokenizer.json + config files."""
    import os

    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("hf-tok")
    gguf_dir, name = os.path.split(embedded_gguf)
    ref = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=name)
    ref.save_pretrained(folder)
    return folder, ref


def test_hf_folder_tokenizer_matches_transformers(hf_tokenizer_folder):
    folder, ref = hf_tokenizer_folder
    ours = Tokenizer.from_hf_folder(str(folder))
    for text in ["What is 12 + 30?", "<|im_start|>user\nhi<|im_end|>", "  spaced\n\nout  "]:
        assert ours.encode(text) == ref.encode(text, add_special_tokens=False)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert ours.apply_chat_template(msgs) == ref.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True
    )
    assert ours.eos_id == ref.eos_token_id and ours.stop_ids == (ref.eos_token_id,)


def test_load_model_from_hf_folder_with_tokenizer(tmp_path, hf_tokenizer_folder):
    import shutil

    folder, _ = hf_tokenizer_folder
    make_hf_checkpoint(tmp_path, "llama")
    for f in folder.iterdir():
        shutil.copy(f, tmp_path)
    with pytest.raises(ValueError, match="tokenizer has 49152 tokens, the model only 64"):
        weights.load(str(tmp_path))


def test_sentencepiece_folder(tmp_path):
    import sentencepiece as spm

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"the number {i} plus {i * 3} equals {i * 4}" for i in range(300)))
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(tmp_path / "tokenizer"),
        vocab_size=60,
        bos_id=1,
        eos_id=2,
        pad_id=0,
        unk_id=3,
    )
    (tmp_path / "tokenizer_config.json").write_text(
        '{"bos_token": "<s>", "eos_token": "</s>", "chat_template": '
        "\"{% for m in messages %}{{ bos_token }}{{ m['content'] }}{% endfor %}\"}"
    )
    tok = Tokenizer.from_hf_folder(str(tmp_path))
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "tokenizer.model"))
    text = "the number 12 plus 36"
    assert tok.encode(text) == sp.encode(text)
    assert tok.decode(tok.encode(text)) == text
    assert (tok.bos_id, tok.eos_id, tok.vocab_size) == (1, 2, 60)
    chat = tok.encode_chat([{"role": "user", "content": text}], add_generation_prompt=False)
    assert chat == [tok.bos_id] + sp.encode(text)  # the template's BOS is the BOS id


def test_left_pad_and_positions():
    from explore_rl.models.transformer import positions_from_mask
    from explore_rl.sampling.shapes import left_pad

    tokens, mask = left_pad([[5, 6, 7], [8]], pad_id=2, length=3)
    np.testing.assert_array_equal(tokens, [[5, 6, 7], [2, 2, 8]])
    np.testing.assert_array_equal(positions_from_mask(mask), [[0, 1, 2], [0, 0, 0]])
    with pytest.raises(ValueError, match="4 tokens, more than the limit 3"):
        left_pad([[1, 2, 3, 4]], 0, length=3)
    assert jnp.sum(mask) == 4
    assert left_pad([[1] * 46], 0)[0].shape == (1, 48)  # bucketed by default
    with pytest.raises(ValueError, match="at least one token"):
        left_pad([[1], []], 0)


# A Llama-3.1-style dated system turn, a role check and Qwen3's thinking switch, in ChatML.
TEMPLATE = (
    "{%- if not date_string is defined %}{%- set date_string = strftime_now('%d %b %Y') %}"
    "{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system = '' %}{%- endif %}"
    "{{- '<|im_start|>system\\nToday Date: ' + date_string + '\\n' + system + '<|im_end|>\\n' }}"
    "{%- for m in messages %}"
    "{%- if m['role'] not in ['user', 'assistant'] %}"
    "{{- raise_exception('roles must be user or assistant') }}{%- endif %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


def test_prompt_formats_render_as_transformers(hf_tokenizer_folder):
    import datetime

    import jinja2

    from explore_rl.models.tokenizer import PromptFormat

    folder, ref = hf_tokenizer_folder
    ours = Tokenizer.from_hf_folder(str(folder))
    ours.chat_template = TEMPLATE
    fmt = PromptFormat(" Box it.", "Be brief.", "", (("enable_thinking", False),))
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2? Box it."}]
    expected = ref.apply_chat_template(
        msgs, chat_template=TEMPLATE, tokenize=False, add_generation_prompt=True,
        enable_thinking=False,
    )  # fmt: skip
    assert fmt.text(ours, "2+2?") == expected
    assert f"Today Date: {datetime.datetime.now():%d %b %Y}\nBe brief." in expected
    assert expected.endswith("<think>\n\n</think>\n\n")
    plain = PromptFormat(" Box it.")  # no system message, the template's defaults
    assert plain.text(ours, "2+2?") == ref.apply_chat_template(
        msgs[1:], chat_template=TEMPLATE, tokenize=False, add_generation_prompt=True
    )
    with pytest.raises(jinja2.exceptions.TemplateError, match="roles must be user or assistant"):
        ours.apply_chat_template([{"role": "tool", "content": "x"}])
    raw = PromptFormat(" Box it.", raw="{bos}Question: {question}\nAnswer:")
    assert raw.text(ours, "2+2?") == f"{ours.bos_token}Question: 2+2? Box it.\nAnswer:"
    latex = PromptFormat(raw="{question}\nPut it in \\boxed{}, as \\frac{a}{b}.")  # braces
    assert latex.text(ours, "1/2?") == "1/2?\nPut it in \\boxed{}, as \\frac{a}{b}."
