"""Review data stays behind the login (issue 19): the review database never sits in a served folder,
so after a review-mode run and a restart in public mode on the same outputs folder no URL returns it;
a database that an older version left in the outputs folder is moved out at start."""
import json
import sqlite3

import httpx
import pytest

import app
from cosmos3_ui.files import FILE_ROUTES
from harness import launched_studio

SQLITE_MAGIC = b"SQLite format 3"


def fetch_everything(base: str, paths) -> list[tuple[str, int, bytes]]:
    got = []
    for path in paths:
        for route in FILE_ROUTES:
            response = httpx.get(base + route + str(path))
            got.append((route + str(path), response.status_code, response.content[:16]))
    return got


def test_after_a_review_run_a_public_restart_serves_no_review_database(tiny_family, tmp_path):
    from gradio_client import Client

    outputs, cache = tmp_path / "o", tmp_path / "c"
    common = ["--model", f"edge={tiny_family['edge']}", "--outputs", str(outputs), "--cache-dir", str(cache)]
    with launched_studio(["--review", "--auth", "alice:pw1", *common]) as (studio, url):
        client = Client(url, auth=("alice", "pw1"), verbose=False)
        _, result = client.predict("edge", json.dumps({"mode": "t2i", "prompt": "a cube", "steps": 1}), None,
                                   api_name="/generate")
        studio.service.reviews.rate(result["request_id"], "alice", {"visual_quality": 4}, "secret reviewer note")
        db = studio.service.reviews.path
    assert db.is_file() and outputs.resolve() not in db.resolve().parents
    assert not [p for p in outputs.rglob("*") if "sqlite" in p.name]  # nor its WAL/SHM files
    # An older version's database left in the outputs folder (with its side files) is moved out at start.
    legacy = outputs / "reviews.sqlite3"
    sqlite3.connect(legacy).executescript("CREATE TABLE notes (text TEXT); INSERT INTO notes VALUES ('old');")
    (outputs / "reviews.sqlite3-wal").write_bytes(b"")

    with launched_studio(common) as (studio, url):
        assert studio.service.reviews is None
        assert not [p for p in outputs.rglob("*") if "sqlite" in p.name]
        candidates = [legacy, f"{legacy}-wal", f"{legacy}-shm", db, f"{db}-wal", f"{db}-shm"]
        for where, status, head in fetch_everything(url.rstrip("/"), candidates):
            assert status != 200 and not head.startswith(SQLITE_MAGIC), where
    # Nothing was lost: the current database keeps its rating, the old one was moved beside it.
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM ratings").fetchone() == (1,)
    [moved] = db.parent.glob("reviews-from-outputs-*.sqlite3")
    assert sqlite3.connect(moved).execute("SELECT text FROM notes").fetchall() == [("old",)]


def test_a_review_database_inside_the_served_outputs_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        app.parse_args(["--review", "--auth", "a:b", "--outputs", str(tmp_path / "o"),
                        "--review-db", str(tmp_path / "o" / "db" / "r.sqlite3")])
    assert "inside the served folder" in capsys.readouterr().err
