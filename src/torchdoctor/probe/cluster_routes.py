"""The endpoints of a rank of a job: its peers (from the job's store) and its own state for
the other ranks' job view. Status 422 when the process is not part of a distributed job."""

from __future__ import annotations

from typing import Any, Protocol

from torchdoctor.probe.server import Routes


class JobMember(Protocol):
    def peers_payload(self) -> dict[str, Any]: ...

    def own_state(
        self, rows: int, since: dict[str, int] | None = None, findings: bool = False
    ) -> dict[str, Any]: ...


def add_cluster_routes(routes: Routes, member: JobMember) -> None:
    def peers(_req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            return 200, member.peers_payload()
        except LookupError as exc:
            return 422, {"error": str(exc)}

    def state(req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        since = req.get("since") or {}
        try:
            rows = int(req.get("rows", 0))
            cursors = {str(k): int(v) for k, v in dict(since).items()}
        except (TypeError, ValueError):
            return 400, {"error": "rows must be a number and since a map of table to row count"}
        try:
            return 200, member.own_state(rows, cursors, bool(req.get("findings")))
        except LookupError as exc:
            return 422, {"error": str(exc)}

    routes.add("GET", "/v1/cluster/peers", peers)
    routes.add("POST", "/v1/cluster/state", state)
