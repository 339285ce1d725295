"""explore_rl: RL post-training of LLMs with verifiable rewards (GRPO) and exploration methods."""

from setuptools import find_packages, setup

setup(
    name="explore_rl",
    version="0.1.0",
    description="JAX GRPO with EDEN, ASE, ExTra and EAD exploration",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["explore_rl", "explore_rl.*", "configs"]),
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.7",
        "flax>=0.10",
        "optax",
        "orbax-checkpoint",
        "tokenizers",
        "jinja2",
        "numpy",
        "ml-dtypes",
        "scikit-learn",
        "scipy",
        "sentencepiece",
        "ml-collections",
        "absl-py",
        "jaxtyping",
        "tensorboard",
        "gguf",
        "math-verify",
        "tqdm",
        "pyarrow",  # Parquet and datasets-folder training data
        "pandas",  # explore_rl.analysis: run tables
        "matplotlib",  # explore_rl.analysis: figures
    ],
    extras_require={
        # torch only as a reference implementation in tests; 2.13.0 is a local CPU wheel.
        "dev": [
            "pytest",
            "pytest-xdist",
            "ruff",
            "torch==2.13.0",
            "transformers",  # reference implementations in the tests; bench's peer
            "accelerate",
            "sentence-transformers",  # the reference for explore_rl/models/minilm.py
            "nbclient",  # executes notebooks/ in the tests
            "nbformat",
            "ipykernel",
            "wandb",  # logging.wandb (its test runs offline)
        ],
        "wandb": ["wandb"],  # logging.wandb=True
    },
)
