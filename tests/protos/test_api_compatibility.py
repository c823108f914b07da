"""The breaking-change check of the public gRPC API: ``buf breaking`` compares protos/*.proto with
the descriptor set of the last release, protos/released/raftlog-v1.binpb, under the rules of
buf.yaml (`make lint` runs the same command).

The current sources must pass, and a copy of them with one deliberate break each (in tmp_path)
must fail with buf's message naming what broke; a field deleted with its number and name
reserved is the one deletion that passes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUF = ROOT / "protos" / "buf" / "node_modules" / ".bin" / "buf"
RELEASED = ROOT / "protos" / "released" / "raftlog-v1.binpb"
BUF_TIMEOUT_S = 120  # one buf run takes well under a second here; a loaded machine is slower

# ProduceRequest's last field, where the compatible changes are made.
TRANSACTIONAL_ID = "  string transactional_id = 4;\n"


def buf_breaking(tree: Path) -> subprocess.CompletedProcess[str]:
    """``buf breaking`` of the module in `tree` (its buf.yaml and protos/) against the release."""
    assert BUF.exists(), (
        "buf is not installed: npm ci --prefix protos/buf (make lint does), with node and npm"
    )
    return subprocess.run(
        [str(BUF), "breaking", "--against", str(RELEASED)],
        cwd=tree, capture_output=True, text=True, timeout=BUF_TIMEOUT_S, check=False,
    )  # fmt: skip


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    """A copy of the module (buf.yaml and the .proto sources) to break."""
    shutil.copy(ROOT / "buf.yaml", tmp_path / "buf.yaml")
    (tmp_path / "protos").mkdir()
    for proto in (ROOT / "protos").glob("*.proto"):
        shutil.copy(proto, tmp_path / "protos" / proto.name)
    return tmp_path


def edit(tree: Path, name: str, within: str, old: str, new: str) -> None:
    """In protos/`name`: a bare name is renamed everywhere; other text is replaced once, at its
    first occurrence after `within` (a declaration's opening line)."""
    path = tree / "protos" / name
    text = path.read_text()
    if old.isidentifier():
        path.write_text(re.sub(rf"\b{old}\b", new, text))
        return
    at = text.index(old, text.index(within))
    path.write_text(text[:at] + new + text[at + len(old) :])


def test_the_current_protos_keep_the_released_api() -> None:
    result = buf_breaking(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


# kind: (file, within, old, new, what buf reports); each break in an element of its own
BREAKS = {
    "field renumbered": (
        "broker.proto", "message ProduceRequest {",
        "  int32 timeout_ms = 2;", "  int32 timeout_ms = 9;",
        r'field "2" with name "timeout_ms" on message "ProduceRequest" was deleted without '
        r'reserving the number "2"',
    ),
    "field removed without reserved": (
        "broker.proto", "message ProduceRequest {", TRANSACTIONAL_ID, "",
        r'field "4" with name "transactional_id" on message "ProduceRequest" was deleted without '
        r'reserving the number "4"',
    ),
    "field type changed": (
        "broker.proto", "message FetchRequest {",
        "  int32 max_wait_ms = 3;", "  int64 max_wait_ms = 3;",
        r'Field "3" with name "max_wait_ms" on message "FetchRequest" changed type from "int32" '
        r'to "int64"',
    ),
    "field renamed": (
        "broker.proto", "message ListOffsetsRequest {", "  int32 isolation_level = 3;",
        "  int32 read_isolation = 3;",
        r'Field "3" on message "ListOffsetsRequest" changed name from "isolation_level" to '
        r'"read_isolation"',
    ),
    "message renamed": (
        "broker.proto", "", "MetadataRequest", "TopicMetadataRequest",
        r'Previously present message "MetadataRequest" was deleted',
    ),
    "RPC removed": (
        "group.proto", "service GroupCoordinatorService {",
        "  rpc ListGroups(ListGroupsRequest) returns (ListGroupsResponse);\n", "",
        r'Previously present RPC "ListGroups" on service "GroupCoordinatorService" was deleted',
    ),
    "service renamed": (
        "share.proto", "", "ShareCoordinatorService", "ShareStateService",
        r'Previously present service "ShareCoordinatorService" was deleted',
    ),
    "enum value renumbered": (
        "transaction.proto", "enum TransactionStatus {", "  DEAD = 6;", "  DEAD = 8;",
        r'enum value "6" on enum "TransactionStatus" was deleted without reserving the number "6"',
    ),
}  # fmt: skip


def test_each_break_of_the_released_api_fails_and_says_what_broke(sources: Path) -> None:
    """One copy with every break at once (each in an element of its own), so that one buf run
    judges them all: each must be reported, at its file."""
    for name, within, old, new, _ in BREAKS.values():
        edit(sources, name, within, old, new)
    result = buf_breaking(sources)
    assert result.returncode != 0, f"buf breaking passed\n{result.stdout}"
    for kind, (name, *_, message) in BREAKS.items():
        reported = [line for line in result.stdout.splitlines() if re.search(message, line)]
        assert reported, f"{kind}: not reported\n{result.stdout}{result.stderr}"
        assert all(line.startswith(f"protos/{name}:") for line in reported), reported


def test_a_changed_package_fails(sources: Path) -> None:
    """A new major version is a new package beside the old one (raftlog.auth.v2 next to v1),
    never the old files renamed. (buf reports this alone: run with the breaks above, it is not.)"""
    edit(sources, "auth.proto", "syntax", "package raftlog.auth.v1;", "package raftlog.auth.v2;")
    result = buf_breaking(sources)
    assert result.returncode != 0
    assert 'File package changed from "raftlog.auth.v1" to "raftlog.auth.v2"' in result.stdout


def test_deleting_with_number_and_name_reserved_and_adding_fields_are_compatible(
    sources: Path,
) -> None:
    reserved = '  reserved 4;\n  reserved "transactional_id";\n  bool dry_run = 5;\n'
    edit(sources, "broker.proto", "message ProduceRequest {", TRANSACTIONAL_ID, reserved)
    result = buf_breaking(sources)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_field_removed_with_only_its_number_reserved_fails(sources: Path) -> None:
    edit(sources, "broker.proto", "message ProduceRequest {", TRANSACTIONAL_ID, "  reserved 4;\n")
    result = buf_breaking(sources)
    assert result.returncode != 0
    assert 'without reserving the name "transactional_id"' in result.stdout, result.stdout
