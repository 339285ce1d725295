"""GGUF files, opened with the `gguf` package (llama.cpp's reader): the metadata fields a
model's config and tokenizer are rebuilt from, and its tensors (`weights.gguf_as_hf_folder`
converts them once).

    r = reader("model.gguf")
    field(r, "general.architecture")     # "llama"
"""

from __future__ import annotations


def reader(path: str):
    """The GGUF file at `path`, opened; a missing or damaged file is one line naming it."""
    import gguf  # imported on first use: most runs read no GGUF file

    try:
        return gguf.GGUFReader(path)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such GGUF file") from None
    except Exception as e:  # the reader raises many types on bad bytes
        raise ValueError(
            f"{path}: not a valid GGUF file, corrupt or truncated ({type(e).__name__}: {e})"
        ) from None


def field(r, key: str, default=None):
    """The metadata value stored under `key`, or `default` when the file has none."""
    value = r.fields.get(key)
    return default if value is None else value.contents()
