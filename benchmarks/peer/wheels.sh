#!/usr/bin/env bash
# Builds the wheels vllm-omni needs on the GPU host (benchmarks/peer/wheels.txt, plus
# antlr4-python3-runtime 4.9.3, which PyPI has only as an sdist: built here, pure Python), packs
# them into one tar and splits it into chunks of < 60 MiB: .gpu/peer1 ... (git-ignored), carried
# like /work/shared/gpu/README.md says for c1..cN. Run from the root of the tree the lead carries:
#   bash benchmarks/peer/wheels.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${PYTHON:-python3}"
out=.gpu
grep -qx '/.gpu/' "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null \
  || echo '/.gpu/' >> "$(git rev-parse --git-common-dir)/info/exclude"
rm -rf "$out"/peer[0-9]* "$out/peer-wheels" && mkdir -p "$out/peer-wheels"
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_34_x86_64 \
  -d "$out/peer-wheels" -r "$here/wheels.txt"
"$py" -m pip wheel -q --no-deps -w "$out/peer-wheels" antlr4-python3-runtime==4.9.3
(cd "$out/peer-wheels" && tar cf ../peer-wheels.tar *.whl)
rm -rf "$out/peer-wheels"
(cd "$out" && split -b 59m -d peer-wheels.tar peerpart && rm peer-wheels.tar)
i=1
for p in "$out"/peerpart*; do mkdir -p "$out/peer$i"; mv "$p" "$out/peer$i/"; i=$((i+1)); done
echo "chunks: $(ls -d "$out"/peer[0-9]* | tr '\n' ' ')"
