"""Tool calls in an answer, read with vLLM's own parser for the format of Qwen's chat template:
`hermes` (vllm.tool_parsers.hermes_tool_parser.Hermes2ProToolParser: `<tool_call>\\n{"name": ...,
"arguments": {...}}\\n</tool_call>`, what vLLM's OpenAI server uses for Qwen2.5/Qwen3 models).
And a forced call (`tool_choice` "required" or a named function) as the structural tag vLLM
builds for that parser (xgrammar), so the model writes the call in its own format, with two
changes: the call's JSON allows at most `MAX_WHITESPACE` whitespace characters in a row (vLLM's
tag lets JSON whitespace run free, and a model that prefers it, e.g. a random tiny one, pads the
call until `max_tokens`; xgrammar's `max_whitespace_cnt` must be >= 1, so one space, as Qwen
writes `{"city": "Paris"}`, stays possible), and `parallel_tool_calls: false` stops after the
first call (vLLM does that only for a named function).

vLLM's internals are reached only here (imported on first use: the server imports vLLM's
OpenAI protocol modules only when a request has tools)."""

from __future__ import annotations

from typing import Any

from omni_mp.http.schemas import DeltaFunction, DeltaToolCall, FunctionCall, ToolCall

PARSER = "hermes"
MAX_WHITESPACE = 1  # whitespace characters in a row inside a forced call's JSON


def _vllm_request(tools: list[dict[str, Any]], tool_choice: Any) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(model="-", messages=[], tools=tools, tool_choice=tool_choice)


def _bound_whitespace(fmt: Any) -> Any:
    """`fmt` (an xgrammar structural-tag format) with every JSON schema in it allowing at most
    MAX_WHITESPACE whitespace characters in a row."""
    from pydantic import BaseModel
    from xgrammar.structural_tag import JSONSchemaFormat

    if isinstance(fmt, JSONSchemaFormat):
        return fmt.model_copy(update={"max_whitespace_cnt": MAX_WHITESPACE})
    if isinstance(fmt, BaseModel):
        update = {}
        for name in type(fmt).model_fields:
            value = getattr(fmt, name)
            if isinstance(value, BaseModel):
                update[name] = _bound_whitespace(value)
            elif isinstance(value, list) and any(isinstance(v, BaseModel) for v in value):
                update[name] = [_bound_whitespace(v) for v in value]
        return fmt.model_copy(update=update)
    return fmt


def structural_tag(tools: list[dict[str, Any]], tool_choice: Any, *, parallel: bool = True) -> str | None:
    """The xgrammar structural tag (JSON) that forces a call for "required" or a named
    function, in the hermes format (see the module docstring); None for "auto" and "none".
    `parallel` False: one call, then the answer ends."""
    if tool_choice in (None, "auto", "none"):
        return None
    from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag

    req = _vllm_request(tools, tool_choice)
    tag = get_model_structural_tag(model=PARSER, tools=req.tools, tool_choice=req.tool_choice, reasoning=False)
    if tag is None:
        return None
    fmt = _bound_whitespace(tag.format)
    if not parallel and hasattr(fmt, "stop_after_first"):
        fmt = fmt.model_copy(update={"stop_after_first": True})
    return tag.model_copy(update={"format": fmt}).model_dump_json()


class ToolCallReader:
    """One answer's tool calls: streamed deltas as the text grows, and the final parse.
    `parallel` False (`parallel_tool_calls: false`): only the answer's first call is returned
    (streamed: the deltas of later calls are dropped)."""

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]], tool_choice: Any, *, parallel: bool = True) -> None:
        from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

        self._parallel = parallel
        self._request = _vllm_request(tools, tool_choice)
        self._parser = Hermes2ProToolParser(tokenizer, self._request.tools)
        self._text = ""
        self._ids: list[int] = []

    def delta(self, text: str, ids: list[int]) -> tuple[str | None, list[DeltaToolCall]]:
        """(new content to show, tool-call deltas) for `text` and `ids` added to the answer."""
        prev_text, prev_ids = self._text, self._ids
        self._text, self._ids = prev_text + text, prev_ids + ids
        got = self._parser.extract_tool_calls_streaming(
            prev_text, self._text, text, prev_ids, self._ids, ids, self._request
        )
        if got is None:
            return None, []
        calls = [
            DeltaToolCall(
                index=c.index,
                id=c.id,
                type=c.type,
                function=None
                if c.function is None
                else DeltaFunction(name=c.function.name, arguments=c.function.arguments),
            )
            for c in got.tool_calls or []
            if self._parallel or c.index == 0
        ]
        return got.content, calls

    def final(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(the answer's content, its tool calls) of the whole answer."""
        got = self._parser.extract_tool_calls(text, self._request)
        if not got.tools_called:
            return text, []
        calls = [
            ToolCall(id=c.id, function=FunctionCall(name=c.function.name, arguments=c.function.arguments))
            for c in got.tool_calls
        ]
        return got.content, calls if self._parallel else calls[:1]
