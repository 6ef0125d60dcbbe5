"""The OpenAI-compatible HTTP server: a client of the coordinator in its own process.

`python -m omni_mp.launch --config X.yaml --http HOST:PORT` starts it once the pipeline
serves (`python -m omni_mp.http` on its own, given the coordinator's client endpoint).
Modules: `app` (routes, auth, limits), `schemas` (the OpenAI request and response bodies),
`pipeline` (which stage answers in text and which in audio, voices, sampling), `chat` (one
request's text and audio as events), `speech` (/v1/audio/speech: the input spoken exactly),
`audio_encode` (mp3, opus, aac, flac and the speed, with PyAV), `voices` (voices and aliases),
`detok` (incremental text, stop strings), `sse`, `media` (input audio and images), `audio_out`
(PCM16 and WAV), `errors`, `metrics`.
"""
