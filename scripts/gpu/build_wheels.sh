#!/usr/bin/env bash
# Builds, here, the Python 3.12 x86-64 wheels of a list for the lent GPU hosts (which reach no
# package index), packs them into one tar and splits it into chunks that each fit one device
# call's carry (64 MiB with the working tree): .gpu/NAME1 ... .gpu/NAMEN (git-ignored), each
# holding one part and the manifest (part count and the tar's sha256) that install.sh checks.
#   bash scripts/gpu/build_wheels.sh                      # scripts/gpu/wheels.txt -> .gpu/omni*
#   bash scripts/gpu/build_wheels.sh benchmarks/peer/wheels.txt peer antlr4-python3-runtime==4.9.3
# Extra arguments are sdists built into wheels here (pure Python only). Idempotent: a list whose
# chunks exist with the same hash is not rebuilt.
set -euo pipefail
cd "$(dirname "$0")/../.."
list="${1:-scripts/gpu/wheels.txt}" name="${2:-omni}"
shift $(( $# < 2 ? $# : 2 ))
py="${PYTHON:-python3}"
out=.gpu
part_kib=${OMNI_MP_CHUNK_KIB:-55296}  # 54 MiB: the tree (~6 MiB) and the chunk fit one 64 MiB carry
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
want=$(cat "$list" | sha256sum | cut -c1-16)-$(echo "$*" | sha256sum | cut -c1-8)
if [[ -f $out/$name.built && $(cat "$out/$name.built") == "$want" ]]; then
  echo "chunks (unchanged): $(ls -d "$out/$name"[0-9]* | tr '\n' ' ')"
  exit 0
fi
t0=$(date +%s)
rm -rf "$out/$name"[0-9]* "$out/$name-wheels" "$out/$name.built" && mkdir -p "$out/$name-wheels"
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 \
  -d "$out/$name-wheels" -r "$list"
for sdist in "$@"; do "$py" -m pip wheel -q --no-deps -w "$out/$name-wheels" "$sdist"; done
(cd "$out/$name-wheels" && tar cf "../$name-wheels.tar" *.whl)
rm -rf "$out/$name-wheels"
sha=$(sha256sum "$out/$name-wheels.tar" | cut -d' ' -f1)
(cd "$out" && split -b "${part_kib}k" -d -a 2 "$name-wheels.tar" "${name}part" && rm "$name-wheels.tar")
parts=("$out/${name}part"*)
i=1
for p in "${parts[@]}"; do
  mkdir -p "$out/$name$i"
  mv "$p" "$out/$name$i/"
  printf '%s %s %s\n' "$name" "${#parts[@]}" "$sha" > "$out/$name$i/manifest"
  i=$((i + 1))
done
echo "$want" > "$out/$name.built"
echo "built ${#parts[@]} chunks of <= $(( part_kib / 1024 )) MiB in $(( $(date +%s) - t0 ))s: $(ls -d "$out/$name"[0-9]* | tr '\n' ' ')"
