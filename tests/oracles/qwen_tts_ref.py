"""Runs INSIDE the qwen-tts reference venv (scripts/oracle_envs/qwen_tts.sh), never imported by
omni_mp: `python qwen_tts_ref.py IN.json OUT.npz`. IN.json: {"model_dir": ..., "requests": [...]}
(each {"kind": "custom_voice"|"voice_design"|"clone_xvector"|"clone_icl"|"clone_wav"|"decode"|"cp_logits", ...};
"clone_wav": the waveform `generate_voice_clone` returns for a clip given as a base64 data: URL of an audio file
(`ref_audio_data`), as a user gets it (in-context: the clip's codes decoded before the new ones and
the clip's share cut), `x_vector_only_mode` as given, `non_streaming_mode` if given, else its default;
"cp_logits": a custom_voice request plus `frames` [N][16], frame-0 codes drawn elsewhere: the
reference code predictor's logits of each step given each frame's earlier codes, `cp_logits_i`
[N, 15, codebook], teacher-forced on the talker's hidden state after the prompt as its generate
hands it to the code predictor).
OUT.npz: per request i, `codes_i` [frames, 16] int64 and `wav_i` float32 (24 kHz); the talker's
inputs as generate() builds them (`inputs_embeds_i` [rows, hidden], `trailing_text_hidden_i`
[steps, hidden], `tts_pad_embed_i` [1, hidden]); token ids, a clone's x-vector and reference
codes; plus `report` (JSON: the load's missing and unexpected tensors, per-request errors, and
`subtalker`: the code predictor's sampling settings the generate wrappers use for this
checkpoint, generation_config.json over their defaults).
Plain JSON/npz across the boundary, no pickle.

fp32, greedy talker and code predictor, repetition penalty 1.0 unless a request names one,
one request per generate call (the reference left-pads batches, which a served request never sees).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch


def _load(model_dir: str):
    from qwen_tts import Qwen3TTSModel

    info: dict = {}
    tts = Qwen3TTSModel.from_pretrained(model_dir, dtype=torch.float32, output_loading_info=False)
    # load check: every tensor of the checkpoint used, every parameter loaded
    from safetensors import safe_open

    for name, module, path in (
        ("model", tts.model, f"{model_dir}/model.safetensors"),
        ("speech_tokenizer", tts.model.speech_tokenizer.model, f"{model_dir}/speech_tokenizer/model.safetensors"),
    ):
        with safe_open(path, framework="pt") as fh:
            stored = set(fh.keys())
        own = set(k for k in module.state_dict() if not k.startswith("speech_tokenizer."))
        info[name] = {"missing": sorted(own - stored), "unexpected": sorted(stored - own)}
    merged = tts._merge_generate_kwargs()  # what generate_custom_voice & co. pass when not told
    info["subtalker"] = {k: merged[k] for k in merged if k.startswith("subtalker_")}
    return tts.model.eval(), tts, info


GREEDY = dict(
    do_sample=False,
    subtalker_dosample=False,
    repetition_penalty=1.0,
    top_k=1,
    top_p=1.0,
    subtalker_top_k=1,
    subtalker_top_p=1.0,
)


class _TalkerInputs:
    """Records what generate() hands the talker: its prompt rows, the per-step text rows and the
    pad row (the reference's own values, for a row-for-row comparison of our prompt builder)."""

    def __init__(self, talker) -> None:
        self.talker, self.inner, self.seen = talker, talker.generate, {}

    def __call__(self, *args, **kwargs):
        for key in ("inputs_embeds", "trailing_text_hidden", "tts_pad_embed"):
            self.seen[key] = kwargs[key][0].detach().float().cpu().numpy()
        return self.inner(*args, **kwargs)


def _codes(model, tts, req: dict, record: dict) -> np.ndarray:
    text_ids = tts._tokenize_texts([tts._build_assistant_text(req["text"])])
    instruct = req.get("instruct") or ""
    instruct_ids = [tts._tokenize_texts([tts._build_instruct_text(instruct)])[0] if instruct else None]
    recorder = _TalkerInputs(model.talker)
    model.talker.generate = recorder  # an instance attribute of this oracle process only
    try:
        ref_ids = [tts._tokenize_texts([tts._build_ref_text(req["ref_text"])])[0]] if req.get("ref_text") else None
        codes, _ = _generate(model, text_ids, instruct_ids, req, _clone_prompt(tts, req, record), ref_ids)
    finally:
        del model.talker.generate
    record.update(recorder.seen)
    record["text_ids"] = text_ids[0][0].cpu().numpy().astype(np.int64)
    if instruct_ids[0] is not None:
        record["instruct_ids"] = instruct_ids[0][0].cpu().numpy().astype(np.int64)
    return codes[0].cpu().numpy().astype(np.int64)


def _cp_logits(model, tts, req: dict, record: dict) -> np.ndarray:
    """The reference code predictor's logits for every step of each given frame 0, fed that
    frame's earlier codes: [N, 15, codebook]. Its inputs as the talker's generate builds them
    (the hidden state after the prompt, recorded from its first code predictor call; the code
    embeddings at the talker's width, projected inside its forward)."""
    cp = model.talker.code_predictor
    seen: dict = {}
    inner = cp.generate

    def record_first(*args, **kwargs):
        seen.setdefault("h", kwargs["inputs_embeds"][:, :1].clone())
        return inner(*args, **kwargs)

    cp.generate = record_first  # an instance attribute of this oracle process only
    try:
        _codes(model, tts, {**req, "max_new_tokens": 2}, record)
    finally:
        del cp.generate
    frames = torch.as_tensor(req["frames"], dtype=torch.long)
    steps = frames.shape[1] - 1
    out = np.zeros((frames.shape[0], steps, cp.config.vocab_size), np.float32)
    for n, frame in enumerate(frames):
        rows = [seen["h"], model.talker.get_input_embeddings()(frame[None, None, 0])]
        for g in range(steps):
            if g:
                rows.append(cp.get_input_embeddings()[g - 1](frame[None, None, g]))
            # a prefill of g + 2 rows: the reference's forward reads lm_head[g] at the last one
            logits = cp(inputs_embeds=torch.cat(rows, dim=1), use_cache=False).logits
            out[n, g] = logits[0, -1].float().numpy()
    return out


def _clone_prompt(tts, req: dict, record: dict) -> dict | None:
    """Base, x-vector mode: the reference clip's speaker embedding as the reference computes it."""
    if req["kind"] not in ("clone_xvector", "clone_icl"):
        return None
    clip = (np.asarray(req["ref_audio"], dtype=np.float32), int(req.get("ref_rate", 24000)))
    icl = req["kind"] == "clone_icl"
    items = tts.create_voice_clone_prompt(ref_audio=clip, ref_text=req.get("ref_text"), x_vector_only_mode=not icl)
    record["speaker_embedding"] = items[0].ref_spk_embedding.detach().float().cpu().numpy()
    if icl:
        record["ref_codes"] = items[0].ref_code.cpu().numpy().astype(np.int64)
    return tts._prompt_items_to_voice_clone_prompt(items)


def _generate(model, text_ids, instruct_ids, req: dict, clone: dict | None = None, ref_ids=None):
    return model.generate(
        voice_clone_prompt=clone,
        ref_ids=ref_ids,
        input_ids=text_ids,
        instruct_ids=instruct_ids,
        languages=[req.get("language", "auto")],
        speakers=[req.get("speaker")] if req["kind"] == "custom_voice" else None,
        non_streaming_mode=req.get("non_streaming_mode", True),
        max_new_tokens=req["max_new_tokens"],
        **(GREEDY | {"repetition_penalty": req.get("repetition_penalty", 1.0)}),
    )


def _decode(model, codes: np.ndarray) -> np.ndarray:
    wavs, _ = model.speech_tokenizer.decode([{"audio_codes": torch.from_numpy(codes)}])
    return np.asarray(wavs[0], dtype=np.float32)


def _clone_wav(tts, req: dict) -> np.ndarray:
    """What `generate_voice_clone` returns for the request (its own reading of a base64 WAV file,
    down-mix, resampling, cut)."""
    clip = req["ref_audio_data"]
    wavs, _ = tts.generate_voice_clone(
        text=req["text"],
        language=req.get("language", "auto"),
        ref_audio=clip,
        ref_text=req.get("ref_text"),
        x_vector_only_mode=bool(req.get("x_vector_only_mode", False)),
        **({"non_streaming_mode": req["non_streaming_mode"]} if "non_streaming_mode" in req else {}),
        max_new_tokens=req["max_new_tokens"],
        **(GREEDY | {"repetition_penalty": req.get("repetition_penalty", 1.0)}),
    )
    return np.asarray(wavs[0], dtype=np.float32)


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    torch.manual_seed(0)
    model, tts, info = _load(spec["model_dir"])
    out: dict[str, np.ndarray] = {}
    errors: dict[str, str] = {}
    with torch.no_grad():
        for i, req in enumerate(spec["requests"]):
            try:
                record: dict = {}
                if req["kind"] == "clone_wav":
                    out[f"wav_{i}"] = _clone_wav(tts, req)
                    continue
                if req["kind"] == "cp_logits":
                    out[f"cp_logits_{i}"] = _cp_logits(model, tts, {**req, "kind": "custom_voice"}, record)
                    continue
                codes = (
                    np.asarray(req["codes"], dtype=np.int64)
                    if req["kind"] == "decode"
                    else _codes(model, tts, req, record)
                )
                out.update({f"{k}_{i}": v for k, v in record.items()})
                out[f"codes_{i}"] = codes
                out[f"wav_{i}"] = _decode(model, codes) if len(codes) else np.zeros(0, np.float32)
            except Exception as e:  # reported, not raised: the caller names the request
                errors[str(i)] = f"{type(e).__name__}: {e}"
    info["errors"] = errors
    info["versions"] = {"torch": torch.__version__, "transformers": __import__("transformers").__version__}
    out["report"] = np.frombuffer(json.dumps(info).encode(), dtype=np.uint8)
    np.savez(sys.argv[2], **out)


if __name__ == "__main__":
    main()
