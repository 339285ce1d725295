"""Qwen2 (Qwen2, Qwen2.5, Qwen2.5-Math): the q/k/v projections carry a bias."""

from explore_rl.models import family

QWEN2 = family.register(
    family.Family(
        "qwen2",
        hf_architecture="Qwen2ForCausalLM",
        layer={**family.LAYER, **family.QKV_BIAS},
        top=family.TOP,
        hf_unsupported=("use_sliding_window",),
        gguf_architecture="qwen2",
    )
)
