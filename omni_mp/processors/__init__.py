"""Stage input processors: turn what upstream stages produced into a stage's inputs.

Processors are looked up by name in the model registry (omni_mp.models.registry: the
generic ones of `generic`, and those of each model family); a pipeline YAML names one, it
never names a module path to import (that would let a config file run arbitrary code). A
stage process uses `stage_processor(name).bind(stage, model_dir)`: model-specific processors
load the tables they need from the stage's checkpoint there.

A processor sees the upstream results accumulated so far, chunk by chunk, so a stage can
start before its upstream has finished (a talker speaks while the thinker still writes):
- `prompt(upstream, ctx)` returns the stage's prompt once it can be built (None: not yet);
- `step_embeds(upstream, start)` (processors with `step_embeds_enabled`) returns the
  per-step extra embeddings known so far from row `start` on, and whether the list is complete;
- `more_inputs(upstream, start)` (processors with `streams_inputs`) returns the input ids
  known so far from `start` on, and whether they are complete (a diffusion stage starts on
  the first codec ids and takes the rest as they come).
"""

from omni_mp.processors.base import (
    ProcessorError,
    RequestContext,
    StageInput,
    StageProcessor,
    UpstreamResult,
)

__all__ = [
    "ProcessorError",
    "RequestContext",
    "StageInput",
    "StageProcessor",
    "UpstreamResult",
]
