"""Qwen3-TTS (the `qwen-tts` package's checkpoints): talker + code predictor -> 12 Hz codec decoder.

Facts and differences from Qwen3-Omni: docs/models/qwen3_tts.md.
"""
