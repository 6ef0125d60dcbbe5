"""LiveKit Agents' OpenAI realtime model (livekit-plugins-openai's `RealtimeModel`) against an
omni_mp server, without a LiveKit server: the model's own session (the object an
`AgentSession` drives) gets a user turn of audio, commits it and asks for a reply with
`generate_reply()` (which resolves only when `response.created` echoes its `client_event_id`
in `response.metadata`); the reply's text and audio frames are written out.

Run by tests/test_http_realtime.py in the clients' own virtualenv (scripts/setup.sh), as
`python livekit_realtime.py BASE_URL API_KEY VOICE IN.pcm OUT.json` (IN.pcm: int16 24 kHz mono;
OUT.json.pcm: the int16 samples the plugin received)."""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
from livekit import rtc
from livekit.plugins import openai as lk_openai

RATE = 24_000


async def main(base_url: str, api_key: str, voice: str, pcm_in: str, out: str) -> None:
    audio = open(pcm_in, "rb").read()
    async with aiohttp.ClientSession() as http:
        model = lk_openai.realtime.RealtimeModel(base_url=base_url, api_key=api_key, voice=voice,
                                                 turn_detection=None, http_session=http)  # fmt: skip
        session = model.session()
        errors: list[str] = []
        session.on("error", lambda ev: errors.append(repr(ev)))
        try:
            await session.update_instructions("Answer briefly.")
            step = RATE // 10 * 2
            for i in range(0, len(audio), step):
                piece = audio[i : i + step]
                session.push_audio(rtc.AudioFrame(piece, RATE, 1, len(piece) // 2))
            session.commit_audio()
            gen = await asyncio.wait_for(session.generate_reply(), 60)
            text, pcm, rates = [], bytearray(), set()
            async for msg in gen.message_stream:

                async def read_text(m=msg) -> None:
                    async for t in m.text_stream:
                        text.append(str(t))

                reading = asyncio.create_task(read_text())
                async for frame in msg.audio_stream:
                    rates.add(frame.sample_rate)
                    pcm += bytes(frame.data)
                await reading
        finally:
            await session.aclose()
            await model.aclose()
    with open(out + ".pcm", "wb") as fh:
        fh.write(pcm)
    with open(out, "w") as fh:
        json.dump({"text": "".join(text), "rates": sorted(rates), "errors": errors}, fh)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
