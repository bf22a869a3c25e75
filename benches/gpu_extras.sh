#!/usr/bin/env bash
# The wheels the TRL baseline needs on the GPU machine, which has transformers, accelerate, pyarrow and pandas
# but not trl, datasets, dill or multiprocess, and no registry: into .gpu/extra/ beside what
# ../shared/tools/gpu-pack put in .gpu/ (run that first; it recreates .gpu/). benches/gpu_suite.py --pack .gpu
# installs them. The versions are the ones the TRL baseline was run with here.
# Also .gpu/commit: the commit the pack was built from, since the tree the device machine gets has no .git and
# a GPU figure must say which code it measured.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .gpu/extra
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/extra trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
git describe --always --dirty --abbrev=12 >.gpu/commit
ls -la .gpu/extra
du -sh .gpu
