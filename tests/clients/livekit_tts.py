"""LiveKit Agents' OpenAI TTS plugin (livekit-plugins-openai) with its defaults (gpt-4o-mini-tts,
voice `ash`, mp3, speed 1.0, `stream_format: sse`) against an omni_mp server: synthesizes one
text and writes the PCM the plugin decoded, with its rate and channel count.

Run by tests/test_http_speech.py in the clients' own virtualenv (scripts/setup.sh), as
`python livekit_tts.py BASE_URL API_KEY TEXT OUT.json` (OUT.json.pcm: the int16 samples)."""

from __future__ import annotations

import asyncio
import json
import sys

from livekit.plugins import openai as lk_openai


async def main(base_url: str, api_key: str, text: str, out: str) -> None:
    tts = lk_openai.TTS(base_url=base_url, api_key=api_key)  # everything else: the plugin's defaults
    rates, channels, pcm = set(), set(), bytearray()
    try:
        async with tts.synthesize(text) as stream:
            async for ev in stream:
                rates.add(ev.frame.sample_rate)
                channels.add(ev.frame.num_channels)
                pcm += bytes(ev.frame.data)
    finally:
        await tts.aclose()
    with open(out + ".pcm", "wb") as fh:
        fh.write(pcm)
    with open(out, "w") as fh:
        json.dump({"rates": sorted(rates), "channels": sorted(channels)}, fh)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
