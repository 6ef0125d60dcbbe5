#!/usr/bin/env bash
# Builds the Python 3.12 wheels of a list (plus sdists built here, pure Python) for the lent GPU
# hosts, packs them into one tar and splits it into chunks of < 60 MiB: .gpu/NAME1 ...
# (git-ignored), carried one per device call like the vLLM chunks (/work/shared/gpu/README.md)
# and installed with --no-deps into a target dir of their own. Run from the root of the tree:
#   bash launch/gpu_wheels.sh launch/gpu-wheels.txt omni       # omni_mp's own (soundfile, soxr)
#   bash launch/gpu_wheels.sh benchmarks/peer/wheels.txt peer antlr4-python3-runtime==4.9.3
set -euo pipefail
list="$1" name="$2"
shift 2
py="${PYTHON:-python3}"
out=.gpu
grep -qx '/.gpu/' "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null \
  || echo '/.gpu/' >> "$(git rev-parse --git-common-dir)/info/exclude"
rm -rf "$out/$name"[0-9]* "$out/$name-wheels" && mkdir -p "$out/$name-wheels"
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_34_x86_64 \
  -d "$out/$name-wheels" -r "$list"
for sdist in "$@"; do "$py" -m pip wheel -q --no-deps -w "$out/$name-wheels" "$sdist"; done
(cd "$out/$name-wheels" && tar cf "../$name-wheels.tar" *.whl)
rm -rf "$out/$name-wheels"
(cd "$out" && split -b 59m -d "$name-wheels.tar" "${name}part" && rm "$name-wheels.tar")
i=1
for p in "$out/${name}part"*; do mkdir -p "$out/$name$i"; mv "$p" "$out/$name$i/"; i=$((i+1)); done
echo "chunks: $(ls -d "$out/$name"[0-9]* | tr '\n' ' ')"
