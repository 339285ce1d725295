"""Tokenizers without torch: HF `tokenizer.json`, sentencepiece, or rebuilt from GGUF metadata.

The chat template is the checkpoint's own Jinja template, rendered the way transformers
renders it (sandboxed, trim_blocks, lstrip_blocks, its `raise_exception` and
`strftime_now` globals, template arguments such as Qwen3's `enable_thinking`). Prompts are
encoded without adding special tokens: the template writes BOS and role markers itself.
A `PromptFormat` says how a question becomes a prompt: the chat template with an optional
system message, or a raw format without a template (base models).

Pad ids are only for filling arrays; masks come from positions, never from pad ids (the
embedded SmolLM2's pad equals its EOS `<|im_end|>`, which also occurs inside prompts).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os
import re

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from explore_rl.models import gguf_io

# Pre-tokenizer splits for GGUF `tokenizer.ggml.pre` values (as llama.cpp and transformers).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GGUF_SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}
_CONTROL = 3  # GGUF token_type of control tokens
_USER_DEFINED = 4


@functools.lru_cache(maxsize=16)
def _compiled_template(template: str) -> jinja2.Template:
    """The template compiled once (compiling costs milliseconds, rendering microseconds)."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    env.globals["raise_exception"] = raise_exception
    # Llama-3.x templates date their system message with it, as transformers provides.
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(template)


def render_chat_template(
    template: str, messages: list[dict], add_generation_prompt: bool, **variables
) -> str:
    return _compiled_template(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt, **variables
    )


@dataclasses.dataclass(frozen=True)
class PromptFormat:
    """How a question becomes a prompt's text."""

    instruction: str = ""  # appended to the question
    system: str = ""  # chat: a system message before the question; "" = none
    raw: str = ""  # "" = the chat template; else this text, {question} (and {bos}) filled
    template_kwargs: tuple = ()  # chat: (name, value) pairs the template reads

    def text(self, tok: Tokenizer, question: str, messages: tuple = ()) -> str:
        """The prompt of `question`, or of `messages` ((role, content) pairs: a chat from
        the data, which carries its own instruction and system message, so neither
        `instruction` nor `system` is added; a raw prompt takes its question)."""
        if messages and not self.raw:
            chat = [{"role": role, "content": content} for role, content in messages]
            return tok.apply_chat_template(chat, **dict(self.template_kwargs))
        content = question + self.instruction
        if self.raw:
            # not str.format: a raw prompt may hold LaTeX braces (\\boxed{}, \\frac{a}{b})
            return self.raw.replace("{bos}", tok.bos_token or "").replace("{question}", content)
        system = [{"role": "system", "content": self.system}] if self.system else []
        return tok.apply_chat_template(
            [*system, {"role": "user", "content": content}], **dict(self.template_kwargs)
        )


class _SentencePiece:
    """Adapter giving a sentencepiece model the `tokenizers` calls we use."""

    def __init__(self, path: str):
        import sentencepiece

        self.sp = sentencepiece.SentencePieceProcessor(model_file=path)
        self.control = {
            self.sp.id_to_piece(i): i
            for i in range(self.sp.get_piece_size())
            if self.sp.is_control(i)
        }
        alternatives = "|".join(map(re.escape, sorted(self.control, key=len, reverse=True)))
        self.split = re.compile(f"({alternatives})") if alternatives else None

    def encode_ids(self, text: str) -> list[int]:
        # sentencepiece reads "<s>" in text as characters; chat templates write it as BOS.
        if self.split is None:
            return self.sp.encode(text)
        ids = []
        for part in self.split.split(text):
            ids += [self.control[part]] if part in self.control else self.sp.encode(part)
        return ids

    def decode(self, ids, skip_special_tokens=True):
        return self.sp.decode(list(ids))

    def get_vocab_size(self):
        return self.sp.get_piece_size()

    def token_to_id(self, token):
        i = self.sp.piece_to_id(token)
        return None if i == self.sp.unk_id() and token != self.sp.id_to_piece(i) else i

    def id_to_token(self, i):
        return self.sp.id_to_piece(i)


class Tokenizer:
    """Text <-> ids, the chat template, and the checkpoint's BOS / EOS / pad / stop ids."""

    def __init__(
        self,
        backend,
        chat_template: str | None,
        bos: str | None,
        eos: str | None,
        pad: str | None,
        extra_stop_ids=(),
    ):
        self.backend = backend
        self.chat_template = chat_template
        self.bos_token, self.eos_token = bos, eos
        self.bos_id = None if bos is None else backend.token_to_id(bos)
        self.eos_id = None if eos is None else backend.token_to_id(eos)
        pad_id = None if pad is None else backend.token_to_id(pad)
        self.pad_id = pad_id if pad_id is not None else (self.eos_id or 0)
        self.stop_ids = tuple(sorted({i for i in (self.eos_id, *extra_stop_ids) if i is not None}))

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        if isinstance(self.backend, _SentencePiece):
            return self.backend.encode_ids(text)
        return self.backend.encode(text, add_special_tokens=False).ids

    def token_ids(self, tokens: str, setting: str) -> list[int]:
        """The ids of comma-separated `tokens`, each one token as written; a one-line error
        naming the config `setting` for one that is not."""
        ids = []
        for name in (t for t in tokens.split(",") if t):
            enc = self.encode(name)
            if len(enc) != 1:
                raise ValueError(f"config: {setting}: {name!r} is {len(enc)} tokens")
            ids.append(enc[0])
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(map(int, ids)), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, **template_kwargs
    ) -> str:
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template (a raw prompt format works)")
        return render_chat_template(
            self.chat_template,
            messages,
            add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **template_kwargs,
        )

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt))

    # ------------------------------------------------------------------------- constructors

    @classmethod
    def character_level(cls, alphabet: str, eos: str = "<eos>", pad: str = "<pad>") -> Tokenizer:
        """One token a character of `alphabet` (ids after the pad and EOS tokens), for
        small models trained from scratch on synthetic tasks: a BPE with no merges, so it
        saves as a standard `tokenizer.json` (`save_hf_folder`) that transformers reads."""
        chars = list(dict.fromkeys(alphabet))
        vocab = {t: i for i, t in enumerate([pad, eos, *chars])}
        backend = HFTokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
        backend.add_special_tokens([AddedToken(pad, special=True), AddedToken(eos, special=True)])
        backend.decoder = decoders.Fuse()
        return cls(backend, None, None, eos, pad)

    @classmethod
    def from_hf_folder(cls, folder: str) -> Tokenizer:
        tj, sp = os.path.join(folder, "tokenizer.json"), os.path.join(folder, "tokenizer.model")
        if os.path.exists(tj):
            backend = HFTokenizer.from_file(tj)
        elif os.path.exists(sp):
            backend = _SentencePiece(sp)
        else:
            raise ValueError(f"{folder}: no tokenizer.json or tokenizer.model in the folder")
        conf = _read_json(os.path.join(folder, "tokenizer_config.json"))
        template = conf.get("chat_template")
        jinja = os.path.join(folder, "chat_template.jinja")
        if template is None and os.path.exists(jinja):
            with open(jinja) as f:
                template = f.read()
        gen = _read_json(os.path.join(folder, "generation_config.json"))
        stops = gen.get("eos_token_id", [])
        stops = [stops] if isinstance(stops, int) else stops
        tok = lambda k: _token_str(conf.get(k))  # noqa: E731
        return cls(backend, template, tok("bos_token"), tok("eos_token"), tok("pad_token"), stops)

    def save_hf_folder(self, folder: str) -> None:
        """`tokenizer.json` + `tokenizer_config.json`: `from_hf_folder(folder)` gives back
        the same ids, special tokens and chat template (transformers reads them too)."""
        if isinstance(self.backend, _SentencePiece):
            raise ValueError("saving a sentencepiece tokenizer is not supported")
        self.backend.save(os.path.join(folder, "tokenizer.json"))
        pad = self.backend.id_to_token(self.pad_id)
        conf = {
            "chat_template": self.chat_template,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": pad,
            "tokenizer_class": "PreTrainedTokenizerFast",
        }
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump(conf, f, indent=2, ensure_ascii=False)

    @classmethod
    def from_gguf(cls, path: str, reader=None) -> Tokenizer:
        """Rebuilt from a GGUF's metadata (slow for a large vocabulary: `weights.load`
        converts a GGUF once and then reads the cached `tokenizer.json`)."""
        reader = reader or gguf_io.reader(path)
        get = lambda k: gguf_io.field(reader, f"tokenizer.ggml.{k}")  # noqa: E731
        if get("model") != "gpt2":
            raise ValueError(
                f"{path}: GGUF tokenizer model {get('model')!r} is not supported "
                "(allowed: gpt2 byte-level BPE)"
            )
        tokens, types, merges = get("tokens"), get("token_type"), get("merges")
        backend = _byte_level_bpe(tokens, merges, get("pre"))
        backend.add_special_tokens(
            [
                AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types)
                if ty == _CONTROL
            ]
        )
        backend.add_tokens(
            [
                AddedToken(t, special=False, normalized=False)
                for t, ty in zip(tokens, types)
                if ty == _USER_DEFINED
            ]
        )
        name = lambda k: None if get(k) is None else tokens[int(get(k))]  # noqa: E731
        return cls(
            backend,
            gguf_io.field(reader, "tokenizer.chat_template"),
            name("bos_token_id"),
            name("eos_token_id"),
            name("padding_token_id"),
        )


def _byte_level_bpe(tokens: list[str], merges: list[str], pre: str | None) -> HFTokenizer:
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(
        vocab=vocab,
        merges=[tuple(m.split(" ", 1)) for m in merges],
        fuse_unk=False,
        byte_fallback=False,
    )
    tok = HFTokenizer(bpe)
    split = _GGUF_SPLITS.get(pre)
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    return tok


def _read_json(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _token_str(value) -> str | None:
    # tokenizer_config.json stores special tokens as strings or as AddedToken dicts.
    return value.get("content") if isinstance(value, dict) else value
