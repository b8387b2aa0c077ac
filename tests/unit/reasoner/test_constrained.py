"""Issue 46: the reasoner decodes under the caption and critique schemas (llguidance), so Enhance and
Describe give a caption on the first attempt on any weights, the tiny random ones included; without
the library the repair path runs, and the result says which ran."""
import json

import numpy as np
import pytest

import engine
from engine.pipeline import captions
from engine.reasoner import ReasonerText, ReasonRequestError, validate_reason_request
from engine.reasoner.schema import (DECODED_FIELDS, SchemaBudgetError, caption_schema, caption_selection,
                                    critique_schema, longest_bytes, scores_from_critique)

RNG = np.random.default_rng(7)
IMAGE = (RNG.random((48, 64, 3)) * 255).astype(np.uint8)
VIDEO = (RNG.random((8, 48, 64, 3)) * 255).astype(np.uint8)
LIBRARY = pytest.importorskip("llguidance")


@pytest.fixture(scope="module")
def loaded(tiny_family):
    return {name: engine.load_model(tiny_family[name]) for name in ("edge", "nano")}


# -- the schemas ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["image", "video"])
def test_the_caption_schema_comes_from_the_caption_fields_and_fits_every_budget(kind):
    schema_fields = captions.fields_for(kind)
    shown = captions.form_layout(kind)
    shown_paths = {t.path for t in shown.texts} | {(t.name, c) for t in shown.tables for c in t.columns}
    for name, children in caption_selection(kind).items():
        assert name in schema_fields  # names and kinds are the caption schema's own
        for child in children:
            assert schema_fields[name].child(child) is not None and (name, child) in shown_paths
        if not children:
            assert (name,) in shown_paths  # every decoded field lands in the caption editor
    assert list(caption_selection(kind)) == [n for n in schema_fields if n in DECODED_FIELDS[kind]]
    smallest = None
    for budget in range(600, 4097, 37):
        try:
            decoded = caption_schema(kind, budget)
        except SchemaBudgetError as error:
            assert "max_new_tokens" in str(error) and str(budget) in str(error)
            assert smallest is None  # refused only below some budget, never above it
            continue
        smallest = smallest or budget
        assert decoded.longest_bytes + 1 <= budget  # the longest answer and its end-of-text token fit
        assert decoded.longest_bytes == longest_bytes(decoded.schema)
    assert smallest is not None and smallest < 1300


def test_longest_bytes_is_the_longest_answer_the_schema_admits():
    schema = captions.caption_json_schema("video", {"subjects": ("description",), "actions": ("time", "description")},
                                          text_chars=lambda path: 5, max_items={"subjects": 2, "actions": 1},
                                          required=("subjects",), child_required={"subjects": ("description",)})
    longest = {"subjects": [{"description": "x" * 5}] * 2, "actions": [{"time": "10:00-10:59", "description": "y" * 5}]}
    assert longest_bytes(schema) == len(json.dumps(longest, separators=(",", ":")))
    with pytest.raises(ValueError, match="'lighting'"):
        captions.caption_json_schema("image", {"lighting": ("glow",)}, text_chars=lambda p: 5, max_items={})
    with pytest.raises(ValueError, match="'actions'"):
        captions.caption_json_schema("image", {"actions": ("time",)}, text_chars=lambda p: 5, max_items={})


def test_a_budget_too_small_for_a_caption_is_refused_naming_the_field():
    with pytest.raises(ReasonRequestError) as error:
        validate_reason_request({"task": "enhance", "prompt": "a kite", "mode": "t2v", "max_new_tokens": 500})
    assert error.value.field == "max_new_tokens" and "500" in str(error.value) and "video caption" in str(error.value)
    assert validate_reason_request({"task": "critique", "prompt": "a kite", "image": IMAGE,
                                    "max_new_tokens": 5}).max_new_tokens == 5  # a short free-text critique


def test_critique_scores_are_read_from_the_schema_answer():
    criteria = ("prompt_adherence", "physics_plausibility")
    answer = {"summary": "a kite", "scores": {"prompt_adherence": {"score": 4, "reason": "red"},
                                              "physics_plausibility": {"score": 9, "reason": "?"}}}
    assert scores_from_critique(answer, criteria) == {"prompt_adherence": 4, "physics_plausibility": None}
    schema = critique_schema(criteria, 768).schema
    assert schema["properties"]["scores"]["required"] == list(criteria)
    assert schema["properties"]["scores"]["properties"]["prompt_adherence"]["properties"]["score"]["enum"] == \
        [1, 2, 3, 4, 5]


# -- the tokens an answer may use ------------------------------------------------------------------------


def test_only_printable_ascii_tokens_of_one_byte_or_more_are_allowed(loaded):
    from engine.reasoner.runtime import reasoner_for

    reasoner = reasoner_for(loaded["edge"])
    reasoner.chat(None, "Hi.", max_new_tokens=1, temperature=0.0, seed=0,
                  schema=critique_schema(("a",), 200).schema)
    grammar = reasoner.grammar
    bits = np.unpackbits(grammar.ascii_words.view(np.uint8), bitorder="little")[:grammar.vocab_size].astype(bool)
    tokenizer = reasoner.pre.tokenizer
    eos = reasoner.model.generation_config.eos_token_id
    for token in range(grammar.vocab_size):
        raw = grammar.tokenizer.decode_bytes([token])
        if token == eos:
            assert bits[token]
        elif bits[token]:
            assert raw and all(0x20 <= b <= 0x7E and b != 0x5C for b in raw), (token, raw)
    assert bits.sum() > 100 and not bits[tokenizer.convert_tokens_to_ids("<|im_start|>")]


class _NotReadable:
    """`input_ids` of a step that a fed constraint must not read (on a GPU, reading it waits for the step)."""

    shape = (1, 5)

    def __getitem__(self, index):
        raise AssertionError("a fed constraint read input_ids")


def _masks(constraint, path: list[int], fed: bool, vocab: int) -> list:
    """The allowed tokens at each step of `path`, asking as Transformers does (a step's scores, then its token)."""
    import torch

    masks = []
    ids = torch.zeros((1, 5), dtype=torch.long)
    for step, token in enumerate(path + [None]):
        scores = constraint(_NotReadable() if fed and step else ids, torch.zeros((1, vocab + 3)))
        masks.append(torch.isfinite(scores[0]))
        if token is not None:
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
            if fed:
                constraint.feed(torch.tensor([token]))
    return masks


def test_a_fed_constraint_gives_the_same_masks_without_reading_the_decoded_tokens(loaded):
    """The reasoner's streamer feeds each token to the constraint, which computes the next mask while the next
    forward runs; Transformers' `generate` alone makes it read `input_ids`. Both give the same masks, and tokens
    past the tokenizer (a wider head) are never allowed."""
    from engine.reasoner.constrained import SchemaConstraint
    from engine.reasoner.runtime import reasoner_for

    reasoner = reasoner_for(loaded["nano"])
    schema = caption_schema("image", 900).schema
    reasoner.chat(None, "Hi.", max_new_tokens=1, temperature=0.0, seed=0, schema=schema)  # builds the grammar
    grammar = reasoner.grammar
    path = reasoner.pre.tokenizer.encode('{"subjects":[{"description":"A red kite over a beach', add_special_tokens=False)
    read = _masks(SchemaConstraint(grammar, schema), path, fed=False, vocab=grammar.vocab_size)
    fed = _masks(SchemaConstraint(grammar, schema), path, fed=True, vocab=grammar.vocab_size)
    assert len(read) == len(path) + 1
    for step, (a, b) in enumerate(zip(read, fed)):
        assert a.equal(b), step
        assert not a[grammar.vocab_size:].any()
    assert read[0].sum() < read[-1].sum()  # the masks follow the path: one opening character, then free text
    for step, token in enumerate(path):
        assert read[step][token]


def test_a_fed_constraint_refuses_a_token_that_breaks_the_schema_and_more_than_one_token_a_step(loaded):
    import torch

    from engine.reasoner.constrained import SchemaConstraint
    from engine.reasoner.runtime import reasoner_for

    reasoner = reasoner_for(loaded["nano"])
    schema = caption_schema("image", 900).schema
    reasoner.chat(None, "Hi.", max_new_tokens=1, temperature=0.0, seed=0, schema=schema)
    constraint = SchemaConstraint(reasoner.grammar, schema)
    scores = torch.zeros((1, reasoner.grammar.vocab_size))
    constraint(torch.zeros((1, 5), dtype=torch.long), scores)
    with pytest.raises(ValueError, match="the streamer sent 2"):
        constraint.feed(torch.tensor([1, 2]))
    bad = reasoner.pre.tokenizer.encode("x", add_special_tokens=False)[0]  # an answer opens with "{"
    constraint.feed(torch.tensor([bad]))
    with pytest.raises(RuntimeError, match="broke the schema"):
        constraint(_NotReadable(), scores)


# -- on the tiny random-weight reasoners: the acceptance -------------------------------------------------


@pytest.mark.parametrize("name", ["edge", "nano"])
@pytest.mark.parametrize("task, extra", [("enhance", {"prompt": "a red kite over a beach", "mode": "t2v"}),
                                         ("describe", {"image": IMAGE, "caption_kind": "image"})])
def test_enhance_and_describe_give_a_caption_in_one_attempt_on_random_weights(loaded, name, task, extra):
    budget = 1300 if extra.get("mode") == "t2v" else 950
    events = []
    result = engine.reason(loaded[name], {"task": task, "max_new_tokens": budget, "seed": 3, **extra},
                           on_progress=events.append)
    assert result.decoding == "constrained:llguidance" and result.attempts == 1 and result.repairs == []
    assert result.tokens <= budget and json.loads(result.text) == result.caption
    # One byte a character and at least one a token: printable ASCII, no escapes (what bounds the tokens).
    assert all(" " <= c <= "~" and c != "\\" for c in result.text)
    assert len(result.text) <= caption_schema(result.caption_kind, budget).longest_bytes
    kind = "video" if task == "enhance" else "image"
    assert result.caption_kind == kind
    mode = "t2v" if kind == "video" else "t2i"
    request = engine.validate_request(engine.VariantInfo.released("nano"), mode,
                                      {"prompt": captions.to_prompt(result.caption)})
    assert request.caption is not None
    # The caption streams as it is written: the text events add up to the answer, one per token.
    streamed = [e for e in events if isinstance(e, ReasonerText)]
    assert "".join(e.text for e in streamed) == result.text and not any(e.restart for e in streamed)
    assert [e.tokens for e in streamed] == list(range(1, result.tokens + 1))


def test_a_video_describe_and_a_first_frame_enhance_are_captions_too(loaded):
    result = engine.reason(loaded["nano"], {"task": "describe", "video": VIDEO, "video_fps": 4, "max_new_tokens": 1300,
                                            "temperature": 0.9, "seed": 11})
    assert result.caption_kind == "video" and result.attempts == 1 and result.caption["actions"]
    result = engine.reason(loaded["edge"], {"task": "enhance", "prompt": "a kite", "image": IMAGE, "mode": "t2i",
                                            "max_new_tokens": 950, "seed": 2})
    assert result.caption_kind == "image" and result.attempts == 1
    assert not [i for i in captions.validate_caption(result.caption, "image") if i.severity == "error"]


def test_critique_gives_every_criterion_a_score_from_one_to_five(loaded):
    criteria = ["prompt_adherence", "physics_plausibility", "color"]
    result = engine.reason(loaded["edge"], {"task": "critique", "prompt": "a kite", "image": IMAGE,
                                            "criteria": criteria, "max_new_tokens": 400, "seed": 0})
    assert result.decoding == "constrained:llguidance"
    answer = json.loads(result.text)
    assert list(answer["scores"]) == criteria
    assert all(result.scores[c] in (1, 2, 3, 4, 5) for c in criteria) and result.tokens <= 400
    short = engine.reason(loaded["edge"], {"task": "critique", "prompt": "a kite", "image": IMAGE,
                                           "max_new_tokens": 8})
    assert short.decoding == "repair" and short.tokens == 8  # too short for the schema: free text, read after


def test_constrained_decode_is_transformers_generate_with_the_constraint(tiny_family, loaded):
    """The schema path is Transformers' own `generate` with our logits processor: greedy tokens agree."""
    import torch
    from transformers import AutoModelForImageTextToText

    from engine.reasoner.constrained import SchemaConstraint
    from engine.reasoner.inputs import build_inputs, messages_for
    from engine.reasoner.runtime import reasoner_for

    reasoner = reasoner_for(loaded["nano"])
    schema = caption_schema("image", 900).schema
    out = reasoner.chat("Caption.", "A kite.", max_new_tokens=900, temperature=0.0, seed=0, schema=schema)
    reference = AutoModelForImageTextToText.from_pretrained(tiny_family["nano"]).eval()
    inputs = build_inputs(reasoner.pre, messages_for("Caption.", "A kite."))
    with torch.no_grad():
        ids = reference.generate(**inputs, max_new_tokens=900, do_sample=False,
                                 logits_processor=[SchemaConstraint(reasoner.grammar, schema)])
    assert out.token_ids == ids[0, inputs["input_ids"].shape[1]:].tolist()
    plain = reasoner.chat("Caption.", "A kite.", max_new_tokens=40, temperature=0.0, seed=0)
    assert plain.token_ids != out.token_ids[:40]  # the constraint changed what random weights write


# -- without the library: the repair path, and the result says so -----------------------------------------


def test_without_the_library_the_repair_path_runs_and_says_so(loaded, monkeypatch):
    import engine.reasoner.constrained as constrained
    from engine.reasoner.runtime import reasoner_for

    monkeypatch.setattr(constrained, "library_available", lambda: False)
    assert reasoner_for(loaded["edge"]).decoding() == "repair"
    request = {"task": "critique", "prompt": "a kite", "image": IMAGE, "max_new_tokens": 300, "temperature": 0}
    result = engine.reason(loaded["edge"], request)  # 300 tokens hold the critique schema (the test above)
    assert result.decoding == "repair" and 0 < result.tokens <= 300
    assert not result.text.startswith('{"summary"')  # free text, its scores read line by line
    monkeypatch.undo()
    assert engine.reason(loaded["edge"], request).decoding == "constrained:llguidance"
