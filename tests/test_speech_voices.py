"""Voice names a speech request may use (omni_mp.http.voices): the model's own, OpenAI's thirteen
names as default aliases of them, and aliases from the pipeline's YAML (`http.voice_aliases`),
which the config schema takes and the server checks against the model's voices at start."""

from __future__ import annotations

import msgspec
import pytest

from omni_mp.config.schema import HttpConfig
from omni_mp.http.voices import OPENAI_VOICES, Voices


def test_openai_names_alias_the_models_voices_by_default() -> None:
    q25 = Voices(["Chelsie", "Ethan"])
    assert q25.resolve("ash") == "Ethan" and q25.resolve("alloy") == "Chelsie" and q25.resolve("ballad") == "Ethan"
    q3 = Voices(["aiden", "chelsie", "ethan"])
    assert q3.resolve("ballad") == "aiden" and q3.resolve("Nova") == "chelsie" and q3.resolve("ETHAN") == "ethan"
    other = Voices(["Zed", "Amy"])  # voices the defaults do not know: the first one
    assert {other.resolve(n) for n in OPENAI_VOICES} == {"Amy"}
    assert all(q25.resolve(n) is not None for n in OPENAI_VOICES)
    assert q25.resolve("nobody") is None and Voices([]).resolve("ash") is None
    listing = {v.id: v.aliases for v in q3.listing(0).data}
    assert sorted(listing) == ["aiden", "chelsie", "ethan"]
    assert sorted(a for aliases in listing.values() for a in aliases) == sorted(OPENAI_VOICES)


def test_configured_aliases_add_and_override_and_bad_ones_are_refused() -> None:
    cfg = msgspec.convert({"voice_aliases": {"Narrator": "ethan", "echo": "Chelsie"}}, HttpConfig)
    v = Voices(["Chelsie", "Ethan"], cfg.voice_aliases)
    assert v.resolve("narrator") == "Ethan" and v.resolve("echo") == "Chelsie" and v.resolve("ash") == "Ethan"
    assert v.names()[:2] == ["Chelsie", "Ethan"] and "narrator" in v.names()
    with pytest.raises(ValueError, match=r"'x' -> 'Nobody': the model's voices are \['Chelsie', 'Ethan'\]"):
        Voices(["Chelsie", "Ethan"], {"x": "Nobody"})
    with pytest.raises(ValueError, match="'ethan' is a voice of the model, not an alias"):
        Voices(["Chelsie", "Ethan"], {"ethan": "Chelsie"})
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"voice_aliases": {"": "Ethan"}}, HttpConfig)
