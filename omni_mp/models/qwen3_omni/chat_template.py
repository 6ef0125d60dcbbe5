"""Qwen3-Omni's chat format: the special token strings of the released tokenizer and the chat
template saved with the tiny checkpoint's processor (one user turn's media parts render as
the released template renders them; vLLM's Qwen3-Omni processor expands each placeholder to the
medium's tokens)."""

from __future__ import annotations

AUDIO_SLOT = "<|audio_start|><|audio_pad|><|audio_end|>"
IMAGE_SLOT = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_SLOT = "<|vision_start|><|video_pad|><|vision_end|>"

# The released tokenizer's special tokens that the model or its processor reads.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)
# Qwen3OmniMoeProcessor reads these named tokens from the tokenizer.
NAMED_TOKENS = {
    "audio_token": "<|audio_pad|>",
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
}
TTS_PAD, TTS_BOS, TTS_EOS = "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>"
# Role words the talker's prompt builder finds right after <|im_start|> (single tokens).
ROLES = ("system", "user", "assistant")

# Qwen's tool-calling format (tokens of the released tokenizer's added vocabulary, not special):
# the answer calls a function as `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`
# (what vLLM's `hermes` tool parser reads), and results come back in a user turn as
# `<tool_response>\n...\n</tool_response>`.
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
TOOL_CALL_START = "<tool_call>"
_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)

# A system turn only when the messages have one (or `tools` are given: then the system turn
# lists them after the system text); for a user message of audio parts, image parts, then text
# it renders `<|im_start|>user\n{AUDIO_SLOT...}{IMAGE_SLOT...}{text}<|im_end|>\n`. Assistant
# turns render their `tool_calls`; consecutive `tool` messages share one user turn.
CHAT_TEMPLATE = (
    "{%- macro content(c) -%}"
    "{%- if c is string -%}{{- c -}}"
    "{%- elif c is not none -%}{%- for part in c -%}"
    "{%- if part['type'] == 'audio' -%}{{- '" + AUDIO_SLOT + "' -}}"
    "{%- elif part['type'] == 'image' -%}{{- '" + IMAGE_SLOT + "' -}}"
    "{%- elif part['type'] == 'video' -%}{{- '" + VIDEO_SLOT + "' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0]['role'] == 'system' -%}{{- content(messages[0]['content']) + '\\n\\n' -}}{%- endif -%}"
    '{{- "' + _TOOLS_HEAD.replace('"', '\\"').replace("\n", "\\n") + '" -}}'
    "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
    '{{- "' + _TOOLS_TAIL.replace('"', '\\"').replace("\n", "\\n") + '<|im_end|>\\n" -}}'
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' and loop.first and tools -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + content(message['content']) + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content(message['content']) -}}"
    "{%- if message['role'] == 'assistant' and message['tool_calls'] -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- if not loop.first or message['content'] -%}{{- '\\n' -}}{%- endif -%}"
    "{%- set f = call['function'] if call['function'] is defined else call -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' -}}"
    "{%- if f['arguments'] is string -%}{{- f['arguments'] -}}{%- else -%}{{- f['arguments'] | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
