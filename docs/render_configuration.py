"""Render docs/CONFIGURATION.md from engine/config.py (each field's variable, default and meaning).

    python3 docs/render_configuration.py            # rewrite it
    python3 docs/render_configuration.py --check    # exit 1 if the committed file differs from a render

Change a variable's meaning or default in engine/config.py, never in the rendered file: tests/unit/project/test_config.py fails
when they differ.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "CONFIGURATION.md"


def main(argv: list[str] | None = None, doc: Path = DOC) -> int:
    sys.path.insert(0, str(ROOT))
    from engine.config import render_markdown

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if the file differs")
    args = parser.parse_args(argv)
    text = render_markdown()
    if doc.exists() and doc.read_text(encoding="utf-8") == text:
        return 0
    if args.check:
        print(f"{doc.name} differs from engine/config.py's render; run python3 docs/render_configuration.py",
              file=sys.stderr)
        return 1
    doc.write_text(text, encoding="utf-8")
    print(f"wrote {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
