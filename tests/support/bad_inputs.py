"""The bad-input catalogue: requests every entry point must refuse with a specific message (the studio's
Generate in test_reliability, the HTTP API in test_http_hardening). Upload names are files test_reliability's
`uploads` fixture writes."""

T2I = {"mode": "t2i", "prompt": "a lighthouse", "steps": 1}
DEEP = "{" + '"a": {' * 100 + '"b": 1' + "}" * 101
POLICY = {"mode": "action", "prompt": "push the block", "steps": 1,
          "action": {"kind": "forward_dynamics", "domain": "bridge_orig_lerobot", "chunk_size": 4, "resolution_tier": 256}}

# (model, request or raw request_json, upload name or None, fragment of the expected message)
CATALOGUE = [
    ("nano", "{not json", None, "request_json is not valid JSON"),
    ("nano", "[1, 2, 3]", None, "request_json must be a JSON object"),
    ("nano", "", None, "request_json is empty"),
    ("nano", {**T2I, "prompt": '{"subjects": [}'}, None, "Line 1, column 15"),
    ("nano", {**T2I, "prompt": DEEP}, None, "nested too deeply"),
    ("nano", {**T2I, "prompt": '{"subjects": "' + "x" * 60_000 + '"}'}, None, "characters long"),
    ("nano", {**T2I, "negative_prompt": '{"bad": '}, None, "negative_prompt looks like a JSON caption"),
    ("nano", {**T2I, "prompt": "   "}, None, "prompt is empty"),
    ("nano", {**T2I, "prompt": 42}, None, "prompt must be a string"),
    ("nano", {**T2I, "width": 512, "height": 512}, None, "Allowed sizes (WxH): 64x64, 96x64, 64x96, 128x64"),
    ("nano", {**T2I, "width": 100, "height": 64}, None, "not a multiple of 16"),
    ("nano", {"mode": "t2v", "prompt": "waves", "num_frames": 8}, None, "4k+1"),
    ("nano", {"mode": "t2v", "prompt": "waves", "num_frames": 33}, None, "in 5..17"),
    ("nano", {**T2I, "steps": -4}, None, "steps must be in [1, 200]"),
    ("nano", '{"mode": "t2i", "prompt": "x", "steps": NaN}', None, "steps must be an integer"),
    ("nano", '{"mode": "t2i", "prompt": "x", "guidance_scale": Infinity}', None, "guidance_scale must be a finite number"),
    ("nano", {**T2I, "guidance_scale": 1e12}, None, "guidance_scale must be in [0, 30]"),
    ("nano", {**T2I, "steps": 10**6}, None, "steps must be in [1, 200]"),
    ("nano", {**T2I, "seed": 2**70}, None, "seed must be in [-1,"),
    ("nano", {**T2I, "seed": "lucky"}, None, "seed must be an integer"),
    ("super", {**POLICY}, "frame.png", "does not support mode 'action'"),
    ("edge", {"mode": "t2v", "prompt": "rain", "sound": True}, None, "cannot generate sound"),
    ("nano", {**POLICY, "action": {**POLICY["action"], "actions": [[0.0] * 70] * 4}}, "frame.png",
     "wider than the model's action width 64"),
    ("nano", {**POLICY, "action": {**POLICY["action"], "domain": "submarine"}}, "frame.png", "Unknown action domain"),
    ("nano", {**POLICY}, "cube.npy", "must be 2-D"),
    ("nano", {**POLICY}, "wide.npy", "wider than the model's action width 64"),
    ("nano", {**POLICY}, "actions.yaml", None),  # an unknown file type: refused as such
    ("nano", {"mode": "i2v", "prompt": "a boat"}, "corrupt.png", "could not be decoded"),
    ("nano", {"mode": "i2v", "prompt": "a boat"}, "empty.png", "empty"),
    ("nano", {"mode": "i2v", "prompt": "a boat"}, "huge.png", "pixels"),
    ("nano", {"mode": "i2v", "prompt": "a boat"}, "notes.txt", None),
    ("nano", {"mode": "i2v", "prompt": "a boat", "image": "../../etc/passwd"}, None, "must not name a file"),
    ("nano", {"mode": "i2v", "prompt": "a boat", "image": "/etc/hostname"}, None, "must not name a file"),
    ("nano", {"mode": "i2v", "prompt": "a boat", "image": "frame\u0000.png"}, None, "must not name a file"),
    ("nano", {**T2I, "colour": "teal"}, None, "Unknown request keys ['colour']"),
    ("no-such-model", T2I, None, "Unknown model 'no-such-model'"),
]
