#!/usr/bin/env bash
# Run on a machine with a package index: fetches what the CUDA check machine lacks into .whl/ (git-ignored).
# That machine has Python 3.12, torch, transformers and accelerate, but no Ray, OmegaConf or DeepSpeed and no
# package index. Ray's wheel is larger than one transfer allows, so it is split into parts that gpu_check.sh joins.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
platforms="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms -d .whl \
  ray==2.60.0 omegaconf==2.4.0 antlr4-python3-runtime==4.9.3 hjson==3.1.0 pydantic==2.12.5 pydantic-core==2.41.5 \
  annotated-types==0.7.0 typing-inspection==0.4.2 py-cpuinfo==9.0.0 msgpack==1.1.2
python3 -m pip download -q --no-deps --no-binary=:all: -d .whl deepspeed==0.19.8
(cd .whl && split -b 40M ray-*.whl ray.whl.part- && rm ray-*.whl)
du -sh .whl
