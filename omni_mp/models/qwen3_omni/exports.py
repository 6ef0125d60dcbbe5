"""What the Qwen3-Omni thinker stage streams to the talker stage: the contract between
`vllm_hooks_thinker` (the producer, stage 0) and the talker's processor (the consumer).

What transformers' `Qwen3OmniMoeForConditionalGeneration.generate` (5.17.0) takes from its
thinker, for a thinker prompt x (L ids) and reply y_0..y_{N-1}:
- `thinker_embed`: hidden_states[0] (the input embeddings) of every token the thinker
  computed: x and y_0..y_{N-2} (the last reply token is never fed back);
- `thinker_hidden`: hidden_states[accept_hidden_layer] (the output of decoder layer
  `accept_hidden_layer - 1`, before any deepstack addition; 24 in the released config) of
  the same tokens;
- the ids x and y, to find the user turn (`user_token_id` after `im_start_token_id`), the
  assistant turn's `<|im_start|>` (the last `im_start, assistant` pair) and the media
  placeholders (thinker `audio_token_id` / `image_token_id` / `video_token_id`).
The talker's prompt reads `thinker_hidden` only at media placeholders of the user turn and
`thinker_embed` everywhere else; its per-step rows read `thinker_embed` of y_1..y_{N-2}.

How the thinker stage streams it (stage YAML: `hidden_states: {layers: [<accept_hidden_layer>]}`,
the generic hidden-state path of omni_mp.engines.vllm_hooks, CUDA-graph safe), per request,
in `UpstreamResult` (omni_mp.models.processor) of the talker stage:
- `prompt_token_ids`: x, the thinker's prompt with media placeholders expanded (one id per
  medium token), on the first chunk;
- `output_token_ids`: y as it is generated (one or more ids per thinker step);
- `layers[accept_hidden_layer(config)]` (a RowStream; `layer_states(k, start, end)` reads
  it): `thinker_hidden`, one row [hidden] per token the thinker computed, in position
  order: rows 0..L-1 for x, row L + j for y_j (j <= N-2); the prompt's rows come with the
  thinker's prefill step, a reply row with the step that fed y_j back. dtype: the
  thinker's (float32 in tests, bfloat16 at real sizes).
- `hidden`: the last layer after the final norm, same rows (the generic path always sends
  it; the talker does not read it).
- `mrope_positions` [3, L] int64 and `mrope_delta`: the thinker's M-RoPE prompt positions.
  The talker's own positions over its user part are the thinker's positions of those tokens
  minus the user turn's first position (the rope index is computed segment by segment from
  the previous maximum, so it shifts with its start); no grid sizes need to travel.

Text embeddings (`thinker_embed` at text positions) are NOT streamed: the consumer computes
them from the thinker's embedding table (`THINKER_EMBED` in the checkpoint; HF's
hidden_states[0] at a text position *is* that table's row, so this is exact). Why: the
talker needs that table anyway for the tts_bos / tts_eos / tts_pad rows (ids that never
appear in the thinker's sequence), and streaming the rows would cost 2 * hidden bytes per
token per request (bf16, hidden 2048: 4 KiB; a 2,500-token prompt 10 MiB; 256 KiB per
decode step at 64 requests) against 152,064 x 2,048 x 2 B = 594 MiB of table held once by
the talker stage (host memory). A deployment that prefers bytes to memory can stream them
with the generic path: `hidden_states: {layers: [0, 24]}` (HF layer 0 = the input
embeddings; at media placeholders it holds the media embeddings, which the talker ignores).

`ThinkerTurns.of(...)` splits a thinker prompt the way transformers' generate does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import torch

# The thinker's input-embedding table in the checkpoint (safetensors name).
THINKER_EMBED = "thinker.model.embed_tokens.weight"


def accept_hidden_layer(config: Mapping[str, Any]) -> int:
    """The HF-numbered thinker layer the talker reads at media placeholders (the checkpoint's
    `talker_config.accept_hidden_layer`; 24 in Qwen3-Omni-30B-A3B). `config`: config.json."""
    return int(config["talker_config"]["accept_hidden_layer"])


class TurnIds(msgspec.Struct, frozen=True):
    """The ids that delimit chat turns and mark media (the checkpoint's config.json)."""

    im_start: int
    user: int
    assistant: int
    media: tuple[int, ...]  # thinker audio / image / video placeholder ids

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TurnIds:
        thinker = config["thinker_config"]
        media = tuple(int(thinker[k]) for k in ("audio_token_id", "image_token_id", "video_token_id") if k in thinker)
        return cls(
            im_start=int(config["im_start_token_id"]),
            user=int(config["user_token_id"]),
            assistant=int(config["assistant_token_id"]),
            media=media,
        )


class ThinkerTurns(msgspec.Struct, frozen=True):
    """A thinker prompt split as transformers' generate splits it.

    `user`: positions (ascending) of every token of the user turn(s): from a user turn's
    `<|im_start|>` up to the next `<|im_start|>`. `media`: the subset of `user` that holds
    media placeholders (the talker reads layer `accept_hidden_layer` there, the embedding
    table elsewhere). `assistant_start`: position of the last `<|im_start|>` followed by
    `assistant` (the prompt's generation prompt; its 3 tokens `<|im_start|>assistant\\n` open
    the talker's assistant part, then reply token y_0)."""

    user: list[int]
    media: list[int]
    assistant_start: int

    @classmethod
    def of(cls, prompt_ids: Sequence[int], ids: TurnIds) -> ThinkerTurns:
        role = -1  # the id after the latest <|im_start|> (transformers: cummax of its positions)
        user: list[int] = []
        assistant_start = -1
        n = len(prompt_ids)
        for i, tok in enumerate(prompt_ids):
            if tok == ids.im_start and i + 1 < n:
                role = prompt_ids[i + 1]
                if role == ids.assistant:
                    assistant_start = i
            if role == ids.user:
                user.append(i)
        if assistant_start < 0:
            raise ValueError("the thinker prompt has no '<|im_start|>assistant' turn to speak")
        media_ids = set(ids.media)
        return cls(user=user, media=[i for i in user if prompt_ids[i] in media_ids], assistant_start=assistant_start)

    def media_mask(self) -> torch.Tensor:
        """[len(user)] bool: which user positions are media placeholders."""
        mask = torch.zeros(len(self.user), dtype=torch.bool)
        where = {p: k for k, p in enumerate(self.user)}
        mask[[where[p] for p in self.media]] = True
        return mask
