from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-transcripts",
        action="store_true",
        default=False,
        help="rewrite tests/metadata_quorum/transcripts/*.txt from the current code",
    )
