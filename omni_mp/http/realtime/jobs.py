"""A realtime response -> the chat pipeline's job: the session's conversation rendered by the
chat endpoint's builder (omni_mp.http.conversation.render, the family's chat template), the
session's voice, tools and limits, the response's overrides."""

from __future__ import annotations

from typing import Any

import msgspec

from omni_mp.http.chat import ChatJob
from omni_mp.http.conversation import ThinkerPrompt, render
from omni_mp.http.errors import bad_request
from omni_mp.http.pipeline import Sampling
from omni_mp.http.realtime.budget import fit, prompt_tokens, token_budget
from omni_mp.http.realtime.history import History
from omni_mp.http.realtime.settings import Settings, max_tokens_of, resolve_voice, tools_of
from omni_mp.http.vllm_hooks_tools import structural_tag
from omni_mp.models.family import CountsAudio
from omni_mp.models.registry import prompt_format


def response_job(srv: Any, s: Settings, history: History, params: Any, audio: bool) -> tuple[ChatJob, int]:
    """The response's job, and the first history item its prompt keeps (omni_mp.http.realtime.
    budget: the caller drops the items before it)."""
    view = srv.view
    if srv.chat.template is None or not view.has_chat_format:
        raise bad_request("this server has no chat template: realtime sessions need one", "model")
    instructions, tools, choice, voice, limit = s.instructions, s.tools, s.tool_choice, s.voice, s.max_tokens
    if params is not None:
        instructions = params.instructions if params.instructions is not None else instructions
        tools = tools_of(params.tools, "response.tools") or None if params.tools is not None else tools
        choice = params.tool_choice if params.tool_choice is not None else choice
        out = params.audio.output if params.audio is not None else None
        name = params.voice or (out.voice if out is not None else None)
        voice = resolve_voice(srv.voices, name, "response.voice") if name else voice
        raw = params.max_output_tokens if params.max_output_tokens is not None else params.max_response_output_tokens
        limit = max_tokens_of(raw, "response.max_output_tokens") if raw is not None else limit
    if tools is not None and not view.chat_policy.tools:
        raise bad_request("this model's chat template has no tools", "session.tools", "unsupported_value")
    if choice == "none":
        tools = None
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        choice = {"type": "function", "function": {"name": choice["name"]}}  # realtime's flat shape -> chat's
    answer_tokens = limit if limit is not None else view.text_stage.sampling.max_tokens
    prompt, start = _fitted_prompt(srv, history, instructions, tools, audio, answer_tokens)
    job = ChatJob(prompt=prompt.text, audios=prompt.audios, images=prompt.images, audio_out=audio,
                  voice=voice if audio else None, audio_format="pcm16", chat_formatted=True)  # fmt: skip
    if not audio:
        job.final_stages = [view.text_stage.id]
    temperature = s.temperature if params is None or params.temperature is None else params.temperature
    job.sampling = view.sampling(Sampling(max_tokens=limit, temperature=temperature), audio=audio)
    if tools is not None:
        job.tools, job.tool_choice = tools, choice
        tag = structural_tag(tools, msgspec.to_builtins(choice))
        if tag is not None:  # a forced call, in the model's own format
            base = job.sampling.get(view.text_stage.id, view.text_stage.sampling)
            job.sampling[view.text_stage.id] = msgspec.structs.replace(base, structural_tag=tag)
    return job, start


def _fitted_prompt(srv: Any, history: History, instructions: str | None, tools: Any, audio: bool,
                   answer_tokens: int | None) -> tuple[ThinkerPrompt, int]:  # fmt: skip
    """The prompt of the history from its first item that keeps it within the token budget."""
    view = srv.view

    def rendered(start: int) -> ThinkerPrompt:
        conv = history.conversation(instructions, tools, start)
        return render(conv, view.chat_policy, srv.chat.template, speak=audio)

    fmt = prompt_format(view.text_stage.prompt_format) if view.text_stage.prompt_format is not None else None
    budget = token_budget(view.cfg.http.realtime, view.max_model_len, answer_tokens)
    if budget is None or not isinstance(fmt, CountsAudio) or srv.tokenizer is None:
        return rendered(0), 0
    start, n = fit(history.items, budget,
                   lambda k: prompt_tokens(srv.tokenizer, fmt, rendered(k).text, history.items[k:]))  # fmt: skip
    if n > budget:
        raise bad_request(f"the conversation's latest turn alone is {n} prompt tokens, over the budget of {budget} "
                          "(http.realtime.max_history_tokens, or the thinker's max_model_len less the answer's "
                          "max_output_tokens)", None, "context_length_exceeded")  # fmt: skip
    return rendered(start), start
