"""Llama (Llama-3.x, SmolLM2): no biases, no q/k norm."""

from explore_rl.models import family

LLAMA = family.register(
    family.Family(
        "llama",
        hf_architecture="LlamaForCausalLM",
        layer=family.LAYER,
        top=family.TOP,
        # HF's Llama can add biases; transformers reads their absence from these fields
        hf_unsupported=("attention_bias", "mlp_bias"),
        hf_fields={"attention_bias": False, "mlp_bias": False},
        gguf_architecture="llama",
        gguf_permuted_qk=True,
    )
)
