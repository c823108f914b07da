from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-txn-transcripts",
        action="store_true",
        default=False,
        help="rewrite tests/dataplane/coordinator/transcripts/transactions/*.txt from the code",
    )
