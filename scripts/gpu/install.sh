#!/usr/bin/env bash
# On a lent GPU host, in the repository's root: keep the wheel chunks this call carried
# (.gpu/NAME*/) in /tmp/omni_mp_wheels (which outlives the call while the machine stays warm),
# and once every part of a set has arrived, check its sha256 and install it with --no-deps into
# /tmp/site (NAME "omni": /tmp/site; other sets, e.g. "peer": /tmp/NAME-site, the benchmarks' --peer-site default). Idempotent.
# Prints what it has; exits 0 when every set seen is installed, 3 while parts are missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
stash=/tmp/omni_mp_wheels
mkdir -p "$stash"
shopt -s nullglob
for dir in .gpu/*/; do
  [[ -f $dir/manifest ]] || continue
  read -r name _ sha < "$dir/manifest"
  # a set rebuilt since its parts were kept here (another sha): the new build's parts replace them
  [[ -f $stash/$name/manifest && $(cut -d' ' -f3 "$stash/$name/manifest") != "$sha" ]] && rm -rf "${stash:?}/$name"
  mkdir -p "$stash/$name"
  cp -n "$dir"/*part* "$dir/manifest" "$stash/$name/"
done
rc=0
for set in "$stash"/*/; do
  read -r name count sha < "$set/manifest"
  target=/tmp/site; [[ $name == omni ]] || target=/tmp/$name-site
  if [[ -f $target/.installed-$sha ]]; then echo "[gpu] $name: installed in $target"; continue; fi
  parts=("$set"/"${name}"part*)
  if (( ${#parts[@]} < count )); then
    echo "[gpu] $name: ${#parts[@]}/$count parts here; carry the others (.gpu/${name}1 ... .gpu/${name}${count})"
    rc=3
    continue
  fi
  t0=$(date +%s)
  got=$(cat "${parts[@]}" | sha256sum | cut -d' ' -f1)
  [[ $got == "$sha" ]] || { echo "[gpu] $name: sha256 mismatch (parts of two builds?)" >&2; exit 1; }
  rm -rf "/tmp/whl-$name" && mkdir -p "/tmp/whl-$name"
  cat "${parts[@]}" | tar x -C "/tmp/whl-$name"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$target" "/tmp/whl-$name"/*.whl
  touch "$target/.installed-$sha"
  echo "[gpu] $name: installed $(ls "/tmp/whl-$name" | wc -l) wheels into $target in $(( $(date +%s) - t0 ))s"
done
exit $rc
