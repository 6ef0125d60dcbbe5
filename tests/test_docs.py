"""The documents against the code and each other: the configuration reference lists every YAML
key, the README stays short, every relative link resolves, and nothing tracked points outside
the repository. Fast: reads files and imports only the config schema (no torch, no engines)."""

from __future__ import annotations

import ast
import re
import subprocess
import typing
from pathlib import Path

import msgspec
import pytest
from msgspec import structs

from omni_mp.config.schema import PipelineConfig

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
CONFIG_DOC = DOCS / "configuration.md"

# The `diffusion.model_options` of each diffusion model type: read from the source (their
# modules import torch), as (file, class).
MODEL_OPTIONS = (
    ("omni_mp/models/qwen2_5_omni/token2wav.py", "Token2WavOptions"),
    ("omni_mp/models/qwen_image/dit.py", "QwenImageOptions"),
    ("omni_mp/models/qwen3_omni/code2wav.py", "Code2WavOptions"),
)


def _schema_structs() -> dict[str, list[str]]:
    """Every Struct reachable from PipelineConfig (class name -> its field names)."""
    found: dict[str, list[str]] = {}

    def walk(tp: object) -> None:
        if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
            if tp.__name__ not in found:
                found[tp.__name__] = [f.name for f in structs.fields(tp)]
                for f in structs.fields(tp):
                    walk(f.type)
            return
        for arg in typing.get_args(tp):
            walk(arg)

    walk(PipelineConfig)
    return found


def _source_struct_fields(path: str, name: str) -> list[str]:
    tree = ast.parse((ROOT / path).read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)
    return [s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]


def _documented_keys(doc: str, names: list[str]) -> dict[str, set[str]]:
    """Per struct name: the keys of the tables after its `(Name)` marker, up to the next marker
    or heading."""
    marks = sorted((m.start(), m[1]) for m in re.finditer(r"\((\w+)\)", doc) if m[1] in names)
    keys: dict[str, set[str]] = {}
    for i, (start, name) in enumerate(marks):
        end = marks[i + 1][0] if i + 1 < len(marks) else len(doc)
        section = doc[start:end]
        heading = re.search(r"^#{1,6} ", section[1:], flags=re.M)
        if heading:
            section = section[: heading.start() + 1]
        keys.setdefault(name, set()).update(re.findall(r"^\| `(\w+)` \|", section, flags=re.M))
    return keys


def test_configuration_reference_lists_every_yaml_key():
    expected = _schema_structs()
    for path, name in MODEL_OPTIONS:
        expected[name] = _source_struct_fields(path, name)
    assert {"PipelineConfig", "StageConfig", "Limits", "ShmPoolConfig", "DiffusionStageConfig"} <= set(expected)
    documented = _documented_keys(CONFIG_DOC.read_text(), list(expected))
    for name, fields in sorted(expected.items()):
        assert name in documented, f"docs/configuration.md has no section marked ({name})"
        missing = sorted(set(fields) - documented[name])
        stale = sorted(documented[name] - set(fields))
        assert not missing, f"docs/configuration.md, ({name}): keys not documented: {missing}"
        assert not stale, f"docs/configuration.md, ({name}): documented keys the code does not have: {stale}"


def test_readme_is_under_12_kib():
    size = len(README.read_bytes())
    assert size < 12288, f"README.md is {size} bytes; keep it under 12288 (details belong in docs/)"


_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _without_code(text: str) -> str:
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.*)$", re.sub(r"```.*?```", "", path.read_text(), flags=re.S), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def test_every_relative_link_resolves():
    broken = []
    for md in _markdown_files():
        for target in _LINK.findall(_without_code(md.read_text())):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            where = f"{md.relative_to(ROOT)} -> {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif ROOT not in dest.parents and dest != ROOT:
                broken.append(f"{where} (outside the repository)")
            elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
                broken.append(f"{where} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


# Paths of the developers' machines (built from parts so that this file does not match itself).
_OUTSIDE = re.compile("|".join((r"\.\./" + "shared\\b", "/" + "work" + "/")))


def _tracked_files(*pathspec: str) -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--", *pathspec], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out.decode().split("\0") if p]


def _pointers_outside(files: list[Path]) -> list[str]:
    hits = []
    for path in files:
        try:
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # binary (plots) or gone from the working tree
        for lineno, line in enumerate(text.splitlines(), 1):
            if _OUTSIDE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()[:120]}")
    return hits


def test_docs_point_nowhere_outside_the_repository():
    hits = _pointers_outside(_tracked_files("README.md", "docs"))
    assert not hits, "paths outside the repository:\n" + "\n".join(hits)


def test_no_tracked_file_points_outside_the_repository():
    hits = _pointers_outside(_tracked_files())
    assert not hits, "paths outside the repository:\n" + "\n".join(hits)
