"""Model critiques in review mode (issue 13): stored beside the human ratings, marked as the model's,
never a rating."""
import json

from PIL import Image

from cosmos3_ui.critique import CritiqueStore, critique_markdown, critique_request
from engine.reasoner import validate_reason_request

RID = "20261201-101500-0123456789ab"
CRITERIA = ("prompt_adherence", "physics_plausibility")


def test_a_critique_sits_beside_the_ratings_and_never_replaces_one(tmp_path):
    from cosmos3_ui.review.store import ReviewStore

    folder = tmp_path / "outputs" / RID
    folder.mkdir(parents=True)
    Image.new("RGB", (16, 16), (200, 30, 30)).save(folder / "image.png")
    (folder / "params.json").write_text(json.dumps({"prompt_text": "a red kite", "params": {"prompt": "a kite"}}))
    store = ReviewStore(tmp_path / "reviews.sqlite3", CRITERIA)
    store.register_result(RID, folder, model="edge", mode="t2i", origin="ui")
    store.rate(RID, "ann", {"prompt_adherence": 5}, "sharp")

    model, request = critique_request(store, RID, store.criteria)
    assert model == "edge" and request["image"].endswith("image.png") and request["prompt"] == "a red kite"
    assert validate_reason_request(request).criteria == CRITERIA

    critiques = CritiqueStore(store)
    critiques.save(RID, "edge", "A red kite.\nprompt_adherence: 2 - blurry", {"prompt_adherence": 2,
                                                                               "physics_plausibility": None})
    critiques.save(RID, "edge", "A red kite.\nprompt_adherence: 3", {"prompt_adherence": 3,
                                                                     "physics_plausibility": None})
    ratings = store.ratings(RID)
    assert [(r["reviewer"], r["scores"]) for r in ratings] == [("ann", {"prompt_adherence": 5})]
    shown = critiques.for_result(RID)
    assert len(shown) == 1 and shown[0]["by"] == "model" and shown[0]["scores"]["prompt_adherence"] == 3
    text = critique_markdown(shown)
    assert "not a rating" in text and "physics_plausibility: no score" in text
    # A reopened store (another reviewer's process) sees the same critique.
    assert CritiqueStore(ReviewStore(tmp_path / "reviews.sqlite3", CRITERIA)).for_result(RID) == shown


def test_a_critique_runs_on_the_real_tiny_reasoner_and_is_stored(tiny_family, tmp_path):
    import engine
    from cosmos3_ui.review.store import ReviewStore

    folder = tmp_path / "outputs" / RID
    folder.mkdir(parents=True)
    Image.new("RGB", (64, 48), (30, 90, 200)).save(folder / "image.png")
    (folder / "params.json").write_text(json.dumps({"prompt_text": "a blue square"}))
    store = ReviewStore(tmp_path / "reviews.sqlite3", CRITERIA)
    store.register_result(RID, folder, model="edge", mode="t2i", origin="ui")
    model_name, request = critique_request(store, RID, store.criteria)
    result = engine.reason(engine.load_model(tiny_family[model_name]), dict(request, max_new_tokens=6))
    critiques = CritiqueStore(store)
    critiques.save(RID, model_name, result.text, result.scores)
    assert critiques.for_result(RID)[0]["text"] == result.text and result.tokens == 6
    assert store.ratings(RID) == []
