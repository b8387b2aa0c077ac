"""The engine's action tables agree with the reference's (diffusers 0.42.1), entry for entry."""
from diffusers.pipelines.cosmos import pipeline_cosmos3_omni as reference

from engine.model.action import ACTION_DOMAINS, RESOLUTION_TIERS, VIEW_POINTS, action_caption


def test_domains_ids_and_widths_match_the_reference():
    assert {n: d.domain_id for n, d in ACTION_DOMAINS.items()} == reference._EMBODIMENT_TO_DOMAIN_ID
    assert {n: d.raw_dim for n, d in ACTION_DOMAINS.items() if d.supported} == reference._EMBODIMENT_TO_RAW_ACTION_DIM


def test_tiers_and_view_points_match_the_reference():
    assert {str(t): {str(k): v for k, v in bins.items()} for t, bins in RESOLUTION_TIERS.items()} == \
        reference._ACTION_RESOLUTION_BINS
    assert VIEW_POINTS == reference._ACTION_VIEWPOINT_TEMPLATES


def test_action_caption_is_the_reference_caption():
    for args in [("pick up the cup", "wrist_view", 17, 5.0, 480, 832), ("push", None, 61, 10.0, 640, 640),
                 ("wave!", "concat_view", 9, 24.0, 544, 736)]:
        description, view, frames, fps, height, width = args
        ours = action_caption(description, view, frames, fps, height, width)
        theirs = reference.Cosmos3OmniPipeline._build_action_json_prompt(
            description, view_point=view, num_frames=frames, fps=fps, height=height, width=width)
        assert ours == theirs
