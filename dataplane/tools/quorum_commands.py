"""``raftlog quorum``: the metadata quorum's voters and observers, and changing the voters
(KIP-853), as Kafka's ``kafka-metadata-quorum`` does.

- ``describe`` prints each voter (id, CONTROLLER and Raft addresses, leader or follower, match
  index, lag, connected) and each observer (a broker following the metadata: its offset as of
  its last heartbeat, its lag);
- ``add-controller --config NODE.toml`` (or ``--id N --address host:port``) makes a running
  controller a voter: start it first with the current voters in ``controller.quorum.voters``;
- ``remove-controller --id N`` takes a voter out (the active controller hands its leadership
  over first when it is the one leaving).

One change at a time; a change that would leave the new voter set without a live majority, the
last voter, an unknown voter or a duplicate id or address is refused with Kafka's error code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from dataplane.client.admin import AdminClient, QuorumDescription, RaftVoter
from dataplane.server.config import NodeConfig
from dataplane.tools.client_commands import JsonOption, console, kafka_errors, print_json
from dataplane.tools.command_config import command_security

__all__ = ["quorum_app"]

DEFAULT_CONTROLLERS = "127.0.0.11:9093,127.0.0.12:9093,127.0.0.13:9093"
quorum_app = typer.Typer(
    help="The metadata quorum: describe it, add and remove controllers (KIP-853).",
    no_args_is_help=True,
)
ControllersOption = Annotated[
    str,
    typer.Option(
        "--bootstrap-controller",
        envvar="RAFTLOG_BOOTSTRAP_CONTROLLER",
        help="comma-separated CONTROLLER addresses (default: the local cluster's)",
    ),
]


def _admin(controllers: str) -> AdminClient:
    found = [a.strip() for a in controllers.split(",") if a.strip()]
    if not found:
        raise typer.BadParameter("no address given", param_hint="--bootstrap-controller")
    return AdminClient(bootstrap_controllers=found, security=command_security())


def _voters_document(voters: tuple[RaftVoter, ...]) -> list[dict[str, object]]:
    return [{"id": v.node_id, "address": v.address, "raft_port": v.raft_port} for v in voters]


@quorum_app.command("describe")
def describe(
    controllers: ControllersOption = DEFAULT_CONTROLLERS, as_json: JsonOption = False
) -> None:
    """The voters (with each one's lag behind the leader) and the observers."""
    with kafka_errors(), _admin(controllers) as admin:
        quorum = admin.describe_quorum()
    if as_json:
        print_json(quorum_document(quorum))
        return
    console.print(
        f"leader {quorum.leader_id}, term {quorum.leader_epoch}, commit index "
        f"{quorum.commit_index}, metadata offset {quorum.metadata_offset}, "
        f"{'has' if quorum.has_quorum else 'NO'} quorum"
    )
    voters = Table("voter", "address", "raft address", "role", "match index", "lag", "connected")
    for v in quorum.voters:
        role = "leader" if v.node_id == quorum.leader_id else "follower"
        voters.add_row(
            str(v.node_id), v.address, v.raft_address, role, _figure(v.match_index),
            _figure(v.lag), "yes" if v.connected else "no",
        )  # fmt: skip
    console.print(voters)
    observers = Table("observer", "metadata offset", "lag")
    for o in quorum.observers:
        observers.add_row(str(o.node_id), _figure(o.metadata_offset), _figure(o.lag))
    console.print(observers)


def quorum_document(quorum: QuorumDescription) -> dict[str, object]:
    return {
        "leader_id": quorum.leader_id,
        "term": quorum.leader_epoch,
        "commit_index": quorum.commit_index,
        "metadata_offset": quorum.metadata_offset,
        "has_quorum": quorum.has_quorum,
        "voters": [
            {
                "id": v.node_id,
                "address": v.address,
                "raft_address": v.raft_address,
                "match_index": v.match_index,
                "lag": v.lag,
                "connected": v.connected,
            }
            for v in quorum.voters
        ],
        "observers": [
            {"id": o.node_id, "metadata_offset": o.metadata_offset, "lag": o.lag}
            for o in quorum.observers
        ],
    }


def _figure(value: int) -> str:
    return "-" if value < 0 else str(value)


@quorum_app.command("add-controller")
def add_controller(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", exists=True, dir_okay=False, help="the new controller's node.toml"
        ),
    ] = None,
    node_id: Annotated[
        int | None, typer.Option("--id", help="its node.id (without --config)")
    ] = None,
    address: Annotated[
        str | None, typer.Option("--address", help="its CONTROLLER host:port (without --config)")
    ] = None,
    raft_port_offset: Annotated[int, typer.Option("--raft-port-offset", min=1)] = 1,
    controllers: ControllersOption = DEFAULT_CONTROLLERS,
    as_json: JsonOption = False,
) -> None:
    """Make a running controller a voter of the metadata quorum (AddRaftVoter)."""
    voter, cluster_id = _new_voter(config, node_id, address, raft_port_offset)
    with kafka_errors(), _admin(controllers) as admin:
        voters = admin.add_raft_voter(voter, cluster_id)
    _print_voters(f"controller {voter.node_id} added", voters, as_json)


def _new_voter(
    config: Path | None, node_id: int | None, address: str | None, raft_port_offset: int
) -> tuple[RaftVoter, str]:
    if config is not None:
        if node_id is not None or address is not None:
            raise typer.BadParameter("give --config or --id and --address, not both")
        node = NodeConfig.load(config)
        me = node.controller_voter()
        return RaftVoter(me.node_id, me.host, me.port, me.raft_port), node.cluster_id
    if node_id is None or address is None:
        raise typer.BadParameter("give --config, or --id and --address")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise typer.BadParameter(f"{address!r} is not host:port", param_hint="--address")
    return RaftVoter(node_id, host, int(port), int(port) + raft_port_offset), ""


@quorum_app.command("remove-controller")
def remove_controller(
    node_id: Annotated[int, typer.Option("--id", help="the voter's node.id")],
    controllers: ControllersOption = DEFAULT_CONTROLLERS,
    as_json: JsonOption = False,
) -> None:
    """Take a controller out of the metadata quorum's voters (RemoveRaftVoter)."""
    with kafka_errors(), _admin(controllers) as admin:
        voters = admin.remove_raft_voter(node_id)
    _print_voters(f"controller {node_id} removed", voters, as_json)


def _print_voters(what: str, voters: tuple[RaftVoter, ...], as_json: bool) -> None:
    if as_json:
        print_json({"voters": _voters_document(voters)})
        return
    ids = ", ".join(f"{v.node_id} ({v.address})" for v in voters)
    console.print(f"{what}; voters: {ids}")
