"""What the Qwen3-Omni talker stage emits: the contract between the talker
(`vllm_hooks_talker`, the producer) and code2wav's processor (the consumer).

Each talker step samples code group 0 of a frame (`codec_head`; the step's token id); the 15
other groups of that frame come from the code predictor, which needs group 0 and so runs in
the talker's NEXT forward (the one that feeds group 0 back, per request, batched). A frame's
16 codes are therefore complete in the forward that computes the position fed with its
group-0 code, and they travel on that position's hidden row:

- The talker stage streams hidden rows (stage YAML: `hidden_states: true`; the generic
  hidden-state path of omni_mp.engines.vllm_hooks). Its model's output row is
  `[hidden_size + NUM_CODE_GROUPS]` float32 (whatever the model dtype):
  `row[:hidden_size]` the talker's last hidden state (after the final norm; what
  `codec_head` reads), `row[-NUM_CODE_GROUPS:]` the 16 codes (exact integers in float32) of
  the frame whose group-0 code was fed at that position, or NO_CODE (-1) everywhere at
  positions that complete no frame (the talker's prompt).
- Frame f of a request is hidden row `P + f`, where P = the talker's prompt length
  (`len(UpstreamResult.prompt_token_ids)` of the talker stage; its prompt ids are
  bookkeeping ids, one per prompt row). Row P + f is computed by the talker step that
  samples group 0 of frame f + 1, so frame f reaches code2wav one talker step after its
  group-0 code was sampled.
- The frame that ends speech: the step whose group-0 code is `codec_eos_token_id` stops the
  request; that code is never fed back, so it has no row and no frame (as in transformers'
  generate, which decodes the frames before eos). A request stopped by `max_tokens` likewise
  has no frame for its last sampled code. A finished request's rows end at P + frames - 1
  (the generic path sends rows for the prompt and every generated token but the last).
- `codes[0]` (group 0) equals the talker's output token id of step f (its
  `output_token_ids[f]`); groups 1..15 are code predictor outputs, all < codebook size.
- A row whose codes are NO_CODE at a position >= P is a frame the talker could not
  complete (a request resumed after preemption recomputes its rows without the code
  predictor's inputs): the consumer must fail the request rather than decode it.
"""

from __future__ import annotations

import torch

NUM_CODE_GROUPS = 16  # codes per 80 ms frame (released config: talker_config.num_code_groups)
NO_CODE = -1  # the codes of a row that completes no frame
ROW_DTYPE = torch.float32  # the talker's output rows (codes are exact integers in float32)


def row_width(hidden_size: int) -> int:
    """The width of the talker's output rows for a talker of `hidden_size`."""
    return hidden_size + NUM_CODE_GROUPS


def codes_of_rows(rows: torch.Tensor) -> torch.Tensor:
    """[n, width] talker rows -> [n, NUM_CODE_GROUPS] int64 codes (NO_CODE: no frame)."""
    if rows.ndim != 2 or rows.shape[1] <= NUM_CODE_GROUPS:
        raise ValueError(f"talker rows: expected [n, hidden + {NUM_CODE_GROUPS}], got {list(rows.shape)}")
    return rows[:, -NUM_CODE_GROUPS:].to(torch.int64)
