"""The reasoner tower (issue 13): tiny checkpoints in both libraries, greedy parity with Transformers'
own `generate`, enhance's repairs and retries against a scripted reasoner, cancel within one token."""
import json
import threading

import numpy as np
import pytest
import torch

import engine
from engine.events import JobCancelled, Progress
from engine.reasoner import ReasonerText, ReasonRequestError, validate_reason_request
from engine import reason
from engine.reasoner.caption import MAX_ATTEMPTS, EnhanceError
from engine.reasoner.inputs import build_inputs, load_preprocessor, messages_for, sample_video
from engine.reasoner.runtime import ChatOutput, choose_policy, reasoner_for, reasoner_status
from engine.reasoner.tasks import CRITIQUE_SYSTEM, critique_text, read_scores

FAMILIES = {"edge": "Cosmos3EdgeForConditionalGeneration", "nano": "Cosmos3OmniForConditionalGeneration",
            "super": "Cosmos3OmniForConditionalGeneration"}
CHECKPOINTS = ["edge", "nano", "super", "edge-distilled", "nano-distilled", "super-distilled"]
RNG = np.random.default_rng(5)
IMAGE = (RNG.random((48, 64, 3)) * 255).astype(np.uint8)
VIDEO = (RNG.random((12, 48, 64, 3)) * 255).astype(np.uint8)


@pytest.fixture(scope="module")
def loaded(tiny_family):
    return {name: engine.load_model(tiny_family[name]) for name in ("edge", "nano")}


# -- the tiny checkpoints -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_tiny_checkpoint_loads_reasoner_in_transformers_and_generator_in_diffusers(tiny_family, name):
    from diffusers import Cosmos3OmniPipeline, ModularPipeline
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    root = tiny_family[name]
    family = name.split("-")[0]
    model, info = AutoModelForImageTextToText.from_pretrained(root, output_loading_info=True)
    assert type(model).__name__ == FAMILIES[family]
    assert model.config.model_type == ("cosmos3_edge" if family == "edge" else "cosmos3_omni")
    assert not info["missing_keys"] and not info["mismatched_keys"]
    # The reasoner's language model is the generator's und tower: one weight set, read by both libraries.
    generator = load_file(str(next((root / "transformer").glob("*.safetensors"))))
    reasoner = model.model.language_model
    assert torch.equal(reasoner.layers[0].self_attn.q_proj.weight, generator["layers.0.self_attn.to_q.weight"])
    assert torch.equal(reasoner.embed_tokens.weight, generator["embed_tokens.weight"])
    assert torch.equal(model.lm_head.weight, generator["lm_head.weight"])
    if name.endswith("-distilled"):  # diffusers reads a distilled folder through modular_model_index.json
        pipe = ModularPipeline.from_pretrained(root)
        pipe.load_components()
    else:
        pipe = Cosmos3OmniPipeline.from_pretrained(root, enable_safety_checker=False)
    assert torch.equal(pipe.transformer.state_dict()["layers.0.self_attn.to_q.weight"],
                       generator["layers.0.self_attn.to_q.weight"])
    assert reasoner_status(root)[0]


def test_a_checkpoint_without_reasoner_says_why(tmp_path):
    ok, why = reasoner_status(tmp_path)
    assert not ok and "config.json" in why
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    ok, why = reasoner_status(tmp_path)
    assert not ok and "'llama'" in why and "cosmos3_edge" in why


# -- greedy parity with Transformers' own generate -------------------------------------------------------


def _media(kind, video_config):
    from engine.pipeline.media import load_image, load_video

    if kind == "image":
        return {"image": load_image(IMAGE)}
    if kind == "video":
        return {"video": sample_video(load_video(VIDEO), 6.0, video_config)}
    return {}


@pytest.mark.parametrize("name", ["edge", "nano"])
@pytest.mark.parametrize("kind", ["text", "image", "video"])
def test_greedy_decode_equals_transformers_generate(tiny_family, loaded, name, kind):
    from transformers import AutoModelForImageTextToText

    root = tiny_family[name]
    reasoner = reasoner_for(loaded[name])
    media = _media(kind, reasoner.video_config())
    streamed = []
    out = reasoner.chat("Be brief.", "What is shown?", max_new_tokens=12, temperature=0.0, seed=3,
                        on_text=lambda text, count: streamed.append(count), **media)

    reference = AutoModelForImageTextToText.from_pretrained(root).eval()
    pre = load_preprocessor(root, reasoner.kind)
    inputs = build_inputs(pre, messages_for("Be brief.", "What is shown?", **media), **media)
    if kind != "text":
        placeholder = "<|image_pad|>" if kind == "image" else "<|video_pad|>"
        grid = inputs["image_grid_thw" if kind == "image" else "video_grid_thw"]
        expected = int(grid.prod(dim=-1).sum()) // 4
        assert int((inputs["input_ids"] == pre.tokenizer.convert_tokens_to_ids(placeholder)).sum()) == expected
    with torch.no_grad():
        ids = reference.generate(**inputs, max_new_tokens=12, do_sample=False)
    expected_ids = ids[0, inputs["input_ids"].shape[1]:].tolist()
    assert out.token_ids == expected_ids
    # One event per token, in order; the stream's end may repeat the last count to flush a held-back partial character.
    assert list(dict.fromkeys(streamed)) == list(range(1, len(expected_ids) + 1))
    assert len(streamed) - len(expected_ids) in (0, 1) and streamed[-1] == len(expected_ids)


@pytest.mark.parametrize("name, kind", [("edge", "text"), ("edge", "image"), ("nano", "text"), ("nano", "video")])
def test_reason_streams_the_same_tokens_as_transformers(tiny_family, loaded, name, kind):
    """`engine.reason` end to end (task prompt, media stage, streamed decode) against Transformers'
    `generate` on the same chat: a short critique for an image or a video (free text: too few tokens for
    its schema), and enhance under the caption schema (`generate` given the same constraint)."""
    from transformers import AutoModelForImageTextToText

    from engine.reasoner.constrained import SchemaConstraint
    from engine.reasoner.request import DEFAULT_CRITERIA
    from engine.reasoner.schema import caption_schema
    from engine.reasoner.tasks import caption_system_prompt, enhance_text

    budget = 1300 if kind == "text" else 10
    request = {"prompt": "a red kite", "max_new_tokens": budget, "temperature": 0}
    if kind == "text":
        request.update(task="enhance", mode="t2v")
        decoded = caption_schema("video", budget)
        system, text = caption_system_prompt("video", decoded), enhance_text("a red kite", False)
    else:
        request.update(task="critique", **({"image": IMAGE} if kind == "image" else {"video": VIDEO, "video_fps": 6}))
        system, text = CRITIQUE_SYSTEM, critique_text("a red kite", DEFAULT_CRITERIA, kind == "video")
    events = []
    result = reason(loaded[name], request, on_progress=events.append)
    streamed = "".join(e.text for e in events if isinstance(e, ReasonerText))
    reasoner = reasoner_for(loaded[name])
    media = _media(kind, reasoner.video_config())
    pre = load_preprocessor(tiny_family[name], reasoner.kind)
    inputs = build_inputs(pre, messages_for(system, text, **media), **media)
    reference = AutoModelForImageTextToText.from_pretrained(tiny_family[name]).eval()
    constraint = [SchemaConstraint(reasoner.grammar, decoded.schema)] if kind == "text" else []
    with torch.no_grad():
        ids = reference.generate(**inputs, max_new_tokens=budget, do_sample=False, logits_processor=constraint)
    expected = pre.tokenizer.decode(ids[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert expected and expected == result.text
    # A character whose bytes have not all arrived is held back, then flushed when the stream ends (random weights
    # may end on one): the streamed text is the answer.
    assert streamed == expected
    progress = [e for e in events if isinstance(e, Progress) and e.stage == "reason"]
    assert [p.step for p in progress] == list(range(1, result.tokens + 1))
    if kind == "text":
        assert result.decoding == "constrained:llguidance" and result.caption == json.loads(expected)
    else:
        assert result.decoding == "repair" and set(result.scores) == set(DEFAULT_CRITERIA)


def test_sampling_is_reproducible_by_seed(loaded):
    reasoner = reasoner_for(loaded["nano"])
    runs = [reasoner.chat(None, "A kite.", max_new_tokens=8, temperature=1.0, seed=s).token_ids for s in (4, 4, 5)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_both_input_routes_agree_where_torchvision_exists(tiny_family):
    pytest.importorskip("torchvision")
    from engine.reasoner.inputs import Preprocessor, load_preprocessor

    for name, kind in (("edge", "edge"), ("nano", "omni")):
        full = load_preprocessor(tiny_family[name], kind)
        assert full.processor is not None
        parts = Preprocessor(kind, full.tokenizer, full.image_processor, None, full.video_config)
        for media in ({"image": _media("image", {})["image"]},
                      {"video": sample_video(_media("video", full.video_config)["video"].frames, 6.0,
                                             full.video_config)}):
            a = build_inputs(full, messages_for(None, "Describe.", **media), **media)
            b = build_inputs(parts, messages_for(None, "Describe.", **media), **media)
            assert a["input_ids"].tolist() == b["input_ids"].tolist()
            key = "pixel_values" if "image" in media else "pixel_values_videos"
            assert torch.allclose(a[key], b[key], atol=2e-2)


def test_inputs_match_transformers_processor_as_recorded(tiny_family):
    """Runs everywhere, torchvision or not: the parts route against what Transformers' own processors
    (AutoProcessor with its torchvision video processor) made of the same image and video, recorded by
    tests/support/record_processor_inputs.py. Tokens exactly, grids exactly, pixels within resampling error."""
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file

    from engine.reasoner.inputs import Preprocessor
    from record_processor_inputs import CHECKPOINTS, FIXTURE, chats, fixed_media, processor_digest

    recorded = load_file(str(FIXTURE))
    with safe_open(str(FIXTURE), framework="pt") as handle:
        meta = json.loads(handle.metadata()["recorded"])
    image, video = fixed_media()
    assert np.array_equal(recorded["media.image"].numpy(), image)
    assert np.array_equal(recorded["media.video"].numpy(), video)
    for name, kind in CHECKPOINTS:
        root = tiny_family[name]
        assert processor_digest(root) == meta[f"{name}.digest"], (
            f"the tiny {name} processor files changed since the recording: run tests/support/record_processor_inputs.py "
            "where torchvision is installed")
        loaded = load_preprocessor(root, kind)
        parts = Preprocessor(kind, loaded.tokenizer, loaded.image_processor, None, loaded.video_config)
        for label, media in chats(parts.video_config):
            ours = build_inputs(parts, messages_for(None, "Describe.", **media), **media)
            theirs = {key[len(f"{name}.{label}."):]: value for key, value in recorded.items()
                      if key.startswith(f"{name}.{label}.")}
            assert sorted(ours) == sorted(theirs), (name, label)
            for key, value in theirs.items():
                if value.is_floating_point():
                    assert torch.allclose(ours[key], value, atol=2e-2), (name, label, key)
                else:
                    assert torch.equal(ours[key], value), (name, label, key)


def test_video_frames_are_sized_as_the_video_processor_sizes_them():
    """One pixel budget for the whole clip (not the image processor's per-image one); Qwen3-VL's
    optional per-frame cap too. Transformers' rule is read from its own code, which imports without
    torchvision (Edge's video processor has the same `smart_resize`)."""
    from types import SimpleNamespace

    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor, smart_resize

    from engine.reasoner.inputs import video_frame_size

    for temporal, kind in ((1, "edge"), (2, "omni")):
        for size in ({"shortest_edge": 1024, "longest_edge": 4096}, {"shortest_edge": 4096, "longest_edge": 24 * 2**20}):
            for frames, height, width in ((2, 48, 64), (4, 48, 64), (8, 480, 832), (16, 720, 1280), (6, 20, 900)):
                config = {"size": size, "patch_size": 16, "merge_size": 2, "temporal_patch_size": temporal}
                assert video_frame_size(kind, config, frames, height, width) == smart_resize(
                    frames, height, width, temporal_factor=temporal, factor=32, min_pixels=size["shortest_edge"],
                    max_pixels=size["longest_edge"])
                if kind == "omni":
                    capped = dict(config, cap_pixels_per_frame=True, max_video_tokens=6)
                    h, w = video_frame_size(kind, capped, frames, height, width)
                    # Transformers (5.25 on) reads the processor's settings through this method.
                    processor = SimpleNamespace(**capped, _merge_and_standardize_kwargs=lambda c=capped, **kw: {**c, **kw})
                    assert (frames // temporal) * (h // 16) * (w // 16) == \
                        Qwen3VLVideoProcessor.get_num_of_video_patches(processor, frames, height, width, {})


class _VideoProcessorStandIn:
    """A video processor's contract for Transformers' processor classes where torchvision (which the
    real one needs) is missing: the pixels come from the parts route; the metadata comes back only
    when asked for (`return_metadata`), as BaseVideoProcessor does."""

    def __init__(self, pre):
        self.pre = pre
        self.merge_size = int(pre.video_config["merge_size"])
        self.temporal_patch_size = pre.temporal_patch

    def __call__(self, videos=None, video_metadata=None, return_metadata=False, **kwargs):
        from transformers.feature_extraction_utils import BatchFeature
        from transformers.video_utils import VideoMetadata

        from engine.reasoner.inputs import VideoClip, _video_pixels

        meta = video_metadata[0]
        pixels, thw = _video_pixels(self.pre, VideoClip(list(videos[0]), meta["fps"], tuple(meta["frames_indices"])))
        data = {"pixel_values_videos": pixels, "video_grid_thw": thw}
        if return_metadata:
            data["video_metadata"] = [VideoMetadata(total_num_frames=meta["total_num_frames"], fps=meta["fps"],
                                                    frames_indices=meta["frames_indices"])]
        return BatchFeature(data)


def test_inputs_are_laid_out_as_transformers_processor_lays_them_out(tiny_family, monkeypatch):
    """Without torchvision: Transformers' own processor classes (chat template, image processor,
    placeholder expansion with per-frame timestamps) against the parts route, token for token. The
    processor route of `build_inputs` (used where torchvision exists) runs here too."""
    from transformers import Cosmos3EdgeProcessor, Qwen3VLProcessor
    from transformers.processing_utils import ProcessorMixin

    from engine.reasoner.inputs import Preprocessor, video_frame_size

    # Its class check looks the video processor up in a registry that is empty without torchvision.
    monkeypatch.setattr(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: None)
    for name, kind, cls in (("edge", "edge", Cosmos3EdgeProcessor), ("nano", "omni", Qwen3VLProcessor)):
        root = tiny_family[name]
        parts = load_preprocessor(root, kind)
        processor = cls(image_processor=parts.image_processor, tokenizer=parts.tokenizer,
                        video_processor=_VideoProcessorStandIn(parts),
                        chat_template=(root / "chat_template.jinja").read_text(encoding="utf-8"))
        full = Preprocessor(kind, parts.tokenizer, parts.image_processor, processor, parts.video_config)
        parts = Preprocessor(kind, parts.tokenizer, parts.image_processor, None, parts.video_config)
        for media in ({}, _media("image", {}), _media("video", parts.video_config)):
            a = build_inputs(full, messages_for("Be brief.", "Describe.", **media), **media)
            b = build_inputs(parts, messages_for("Be brief.", "Describe.", **media), **media)
            assert sorted(a) == sorted(b)
            for key in a:
                assert torch.equal(a[key], b[key]), (name, list(media), key)
            if "video" in media:
                assert "seconds>" in parts.tokenizer.decode(a["input_ids"][0])
                clip = media["video"]
                h, w = video_frame_size(kind, parts.video_config, len(clip.frames), clip.frames[0].height,
                                        clip.frames[0].width)
                assert a["video_grid_thw"].tolist() == [[len(clip.frames) // parts.temporal_patch, h // 16, w // 16]]


# -- cancel ----------------------------------------------------------------------------------------------


def test_cancel_stops_within_one_token(loaded):
    reasoner = reasoner_for(loaded["edge"])
    cancel = threading.Event()
    seen = []

    def on_text(text, count):
        seen.append(count)
        if count == 3:
            cancel.set()

    with pytest.raises(JobCancelled):
        reasoner.chat(None, "Tell a long story.", max_new_tokens=64, temperature=0.0, seed=0, on_text=on_text,
                      cancel=cancel)
    assert seen == [1, 2, 3]
    # The reasoner keeps serving after a cancelled job.
    assert len(reasoner.chat(None, "Again.", max_new_tokens=2, temperature=0.0, seed=0).token_ids) == 2


# -- validation ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("params, field, quoted", [
    ({"task": "summarise"}, "task", "'summarise'"),
    ({"task": "enhance", "prompt": "  "}, "prompt", "empty"),
    ({"task": "describe"}, "image", "neither"),
    ({"task": "enhance", "prompt": "x", "max_new_tokens": 0}, "max_new_tokens", "1..4096"),
    ({"task": "enhance", "prompt": "x", "temperature": "hot"}, "temperature", "'hot'"),
    ({"task": "enhance", "prompt": "x", "seed": 1.5}, "seed", "1.5"),
    ({"task": "enhance", "prompt": "x", "mode": "t2v", "caption_kind": "audio"}, "caption_kind", "'audio'"),
    ({"task": "enhance", "prompt": "x", "steps": 3}, "steps", "allowed"),
    ({"task": "enhance", "prompt": "x", "video": VIDEO}, "video", "first frame"),
    ({"task": "describe", "image": IMAGE, "video": VIDEO}, "video", "both"),
    ({"task": "critique", "prompt": "x", "image": IMAGE, "criteria": []}, "criteria", "[]"),
    ({"task": "enhance", "prompt": "x", "mode": 3}, "mode", "3"),
])
def test_bad_requests_name_the_field(params, field, quoted):
    with pytest.raises(engine.RequestError) as error:  # the same kind as a generation request's
        validate_reason_request(params)
    assert isinstance(error.value, ReasonRequestError)
    assert error.value.field == field and field in str(error.value) and quoted in str(error.value)


def test_a_bad_upload_is_refused_naming_its_field():
    with pytest.raises(engine.RequestError) as error:
        reason(None, {"task": "describe", "image": np.zeros((4, 4), np.uint8)}, backend=Scripted("{}"))
    assert error.value.field == "image" and "image" in str(error.value).lower()
    request = validate_reason_request({"task": "describe", "image": IMAGE})
    assert validate_reason_request(request) is request  # validated once; given back in as it is


def test_requests_take_the_task_defaults():
    request = validate_reason_request({"task": "enhance", "prompt": "a kite", "mode": "t2i"})
    assert request.caption_kind == "image" and request.temperature == 0.7 and request.seed == -1
    assert validate_reason_request({"task": "describe", "video": VIDEO}).greedy


# -- enhance against a scripted reasoner ----------------------------------------------------------------


class Scripted:
    """Answers from a list, streamed in a few pieces, like the real backend."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.asked = []

    def video_config(self):
        return {"fps": 2, "min_frames": 2, "max_frames": 8, "temporal_patch_size": 1}

    def chat(self, system, text, *, image, video, max_new_tokens, temperature, seed, on_text=None, cancel=None):
        self.asked.append({"system": system, "text": text, "image": image is not None})
        answer = self.answers.pop(0)
        pieces = [answer[i:i + 16] for i in range(0, len(answer), 16)]
        for count, piece in enumerate(pieces, 1):
            if on_text:
                on_text(piece, count)
        return ChatOutput(answer, list(range(len(pieces))), 20, 0.01, 0.02)


GOOD_VIDEO = {"subjects": [{"description": "a red kite", "action": "climbs"}], "background_setting": "a beach",
              "lighting": {"conditions": "noon sun"}, "cinematography": {"camera_motion": "tilt up"},
              "actions": [{"time": "0:00-0:04", "description": "The kite climbs."}]}


def _enhance(backend, mode="t2v", **extra):
    return reason(None, {"task": "enhance", "prompt": "a kite on a beach", "mode": mode, **extra}, backend=backend)


def test_enhance_takes_a_valid_answer_as_it_is():
    backend = Scripted(json.dumps(GOOD_VIDEO))
    result = _enhance(backend)
    assert result.caption == GOOD_VIDEO and result.attempts == 1 and result.repairs == []
    assert result.decoding == "repair"  # a backend that constrains nothing: the answer is read and repaired
    assert "actions" in backend.asked[0]["system"] and "a kite on a beach" in backend.asked[0]["text"]


def test_enhance_repairs_fences_prose_trailing_commas_and_truncation():
    fenced = "Here is your caption:\n```json\n" + json.dumps(GOOD_VIDEO)[:-1] + ",}\n```\nEnjoy!"
    result = _enhance(Scripted(fenced))
    assert result.caption == GOOD_VIDEO and result.attempts == 1
    assert any("code fence" in r for r in result.repairs) and any("trailing commas" in r for r in result.repairs)
    cut = json.dumps(GOOD_VIDEO)[:-6]  # the token budget ran out inside the last string
    result = _enhance(Scripted(cut))
    assert result.caption["actions"][0]["description"] == "The kite climb"
    assert any("cut off" in r for r in result.repairs)


def test_enhance_repairs_wrong_types_with_one_obvious_fix():
    wrong = dict(GOOD_VIDEO, subjects={"description": "a red kite", "age": 3, "clothing": ["red", "silk"]},
                 background_setting=7, context=None)
    result = _enhance(Scripted(json.dumps(wrong)))
    assert result.caption["subjects"] == [{"description": "a red kite", "age": 3, "clothing": "red; silk"}]
    assert result.caption["background_setting"] == "7" and "context" not in result.caption
    assert result.attempts == 1 and len(result.repairs) == 4


def test_enhance_retries_with_the_problem_then_succeeds():
    backend = Scripted("I cannot write JSON today.", json.dumps(dict(GOOD_VIDEO, lighting="bright")),
                       json.dumps(GOOD_VIDEO))
    result = _enhance(backend)
    assert result.caption == GOOD_VIDEO and result.attempts == 3
    assert "no JSON object" in backend.asked[1]["text"]
    assert "lighting: must be an object" in backend.asked[2]["text"]


def test_enhance_gives_a_precise_error_after_the_last_attempt():
    missing = {k: v for k, v in GOOD_VIDEO.items() if k != "actions"}
    backend = Scripted(*[json.dumps(missing)] * MAX_ATTEMPTS)
    with pytest.raises(EnhanceError) as error:
        _enhance(backend)
    assert f"in {MAX_ATTEMPTS} attempts" in str(error.value) and "missing fields: actions" in str(error.value)
    assert len(backend.asked) == MAX_ATTEMPTS
    # The same caption is complete for an image (no actions there), and a first frame is passed on.
    image_caption = {k: v for k, v in missing.items()}
    image_caption["subjects"] = [{"description": "a red kite"}]
    backend = Scripted(json.dumps(image_caption))
    result = _enhance(backend, mode="t2i", image=IMAGE)
    assert result.caption_kind == "image" and backend.asked[0]["image"]
    with pytest.raises(EnhanceError) as error:
        _enhance(Scripted('{"subjects": [{"age": 3}], "lighting": 5}', "[1, 2]", "{\"subjects\": "), mode="t2i")
    message = str(error.value)
    assert "attempt 1: wrong field types: lighting: must be an object" in message
    assert "attempt 2: the answer holds no JSON object" in message
    assert "attempt 3: the answer is not valid JSON" in message


def test_describe_and_critique_read_their_answers():
    result = reason(None, {"task": "describe", "video": VIDEO, "video_fps": 6}, backend=Scripted(json.dumps(GOOD_VIDEO)))
    assert result.caption == GOOD_VIDEO and result.caption_kind == "video"
    answer = "A kite rises over sand.\nprompt_adherence: 4 - the kite is red\nPhysics plausibility: 2 - it hovers"
    result = reason(None, {"task": "critique", "prompt": "a kite", "image": IMAGE}, backend=Scripted(answer))
    assert result.scores == {"prompt_adherence": 4, "physics_plausibility": 2} and result.text == answer
    assert read_scores("prompt_adherence: great", ("prompt_adherence",)) == {"prompt_adherence": None}


def test_memory_policy_follows_the_room_left():
    gib = 2**30
    assert choose_policy(None, 30 * gib, 18 * gib, 0) == "resident"
    assert choose_policy(141 * gib, 31 * gib, 18 * gib, 64 * gib) == "resident"
    assert choose_policy(80 * gib, 31 * gib, 36 * gib, 64 * gib) == "offloaded"
    assert choose_policy(80 * gib, 31 * gib, 36 * gib, 8 * gib) == "on_demand"


def test_every_memory_policy_decodes_the_same_tokens(loaded):
    """`offloaded` moves the reasoner back to the host after each job, `on_demand` drops it (read again
    from disk next time); both decode what `resident` decodes."""
    model = loaded["nano"]
    expected = reasoner_for(model, policy="resident").chat(None, "A kite.", max_new_tokens=4, temperature=0.0,
                                                           seed=0).token_ids
    for policy in ("offloaded", "on_demand", "resident"):
        reasoner = reasoner_for(model, policy=policy)
        assert reasoner.policy == policy
        for _ in range(2):
            assert reasoner.chat(None, "A kite.", max_new_tokens=4, temperature=0.0, seed=0).token_ids == expected
            assert (reasoner.model is None) == (policy == "on_demand")
            if policy == "offloaded":
                assert next(reasoner.model.parameters()).device.type == "cpu"


# -- through the job queue -------------------------------------------------------------------------------


def test_reason_jobs_share_the_queue_and_cancel_within_one_token(tiny_family, tmp_path):
    from engine.events import Cancelled, Finished, Started
    from engine.serving.queue import JobQueue
    from engine.serving.registry import ModelEntry, ModelRegistry

    jobs = JobQueue(ModelRegistry([ModelEntry("edge", str(tiny_family["edge"]))]), tmp_path / "out")
    try:
        with pytest.raises(ReasonRequestError) as error:
            jobs.submit("edge", {"task": "critique", "prompt": "a kite"})
        assert error.value.field == "image"
        handle = jobs.submit("edge", {"task": "critique", "prompt": "a kite", "image": IMAGE, "max_new_tokens": 6})
        events = list(handle.events(timeout=120))
        assert isinstance(events[1], Started) and isinstance(events[-1], Finished)
        result = events[-1].result
        assert result.tokens == 6 and "".join(e.text for e in events if isinstance(e, ReasonerText)) == result.text

        handle = jobs.submit("edge", {"task": "critique", "prompt": "a kite", "image": IMAGE,
                                      "max_new_tokens": 4000, "temperature": 0})
        counts = []
        for event in handle.events(timeout=120):
            if isinstance(event, ReasonerText):
                counts.append(event.tokens)
                if event.tokens == 5:
                    handle.cancel()
            last = event
        assert isinstance(last, Cancelled) and max(counts) <= 6
        with pytest.raises(JobCancelled):
            handle.result(timeout=1)
    finally:
        jobs.close()
