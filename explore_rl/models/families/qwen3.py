"""Qwen3: no biases, an RMSNorm over each head's q and k before RoPE."""

from explore_rl.models import family

QWEN3 = family.register(
    family.Family(
        "qwen3",
        hf_architecture="Qwen3ForCausalLM",
        layer={**family.LAYER, **family.QK_NORM},
        top=family.TOP,
        hf_unsupported=("use_sliding_window",),
        gguf_architecture="qwen3",
    )
)
