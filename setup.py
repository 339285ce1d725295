"""explore_rl: RL post-training of LLMs with verifiable rewards (GRPO) and exploration methods."""

import glob
import os
import re

from setuptools import find_packages, setup

VERSION = re.search(r'__version__ = "(.+)"', open("explore_rl/__init__.py").read())[1]
# data/ (benchmark files, the lab's splits and tokenizer) travels in a wheel as
# explore_rl/benchmarks/ (explore_rl.data.jsonl.DATA_DIR finds either)
DATA = sorted(
    os.path.relpath(f, "data") for f in glob.glob("data/**/*", recursive=True) if os.path.isfile(f)
)

setup(
    name="explore_rl",
    version=VERSION,
    description="JAX GRPO with EDEN, ASE, ExTra and EAD exploration",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    packages=[
        *find_packages(include=["explore_rl", "explore_rl.*", "configs"]),
        "explore_rl.benchmarks",
    ],
    package_dir={"explore_rl.benchmarks": "data"},
    package_data={"explore_rl.benchmarks": DATA},
    entry_points={"console_scripts": ["explore-rl = explore_rl.main:cli"]},
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.7",
        "flax>=0.10",
        "optax",
        "orbax-checkpoint",
        "tokenizers",
        "jinja2",
        "numpy",
        # 0.7.0 takes ~1 s to import (perf: numpy's PyUFunc_AddLoop comparing each new loop
        # with those registered), paid by every process that imports JAX; 0.6.0: 0.01 s
        "ml-dtypes<0.7",
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
            "coverage>=7.10.6",  # `make coverage` (7.10.6: processes started in other folders)
            "pytest-cov>=7",
            "ruff",
            "torch==2.13.0",
            "transformers",  # reference implementations in the tests; bench's peer
            "accelerate",
            "peft",  # the reference for explore_rl/models/lora.py's adapter folders
            "sentence-transformers",  # the reference for explore_rl/models/minilm.py
            "nbclient",  # executes notebooks/ in the tests
            "nbformat",
            "ipykernel",
            "wandb",  # logging.wandb (its test runs offline)
        ],
        "wandb": ["wandb"],  # logging.wandb=True
        # notebooks/: open them (jupyter lab) or run them headless (jupyter nbconvert --execute)
        "notebooks": ["jupyterlab", "nbconvert", "ipykernel"],
        "cuda12": ["jax[cuda12]>=0.7"],  # NVIDIA GPUs: jaxlib's CUDA 12 wheels
        "tpu": ["jax[tpu]>=0.7"],  # a Cloud TPU VM: libtpu
    },
)
