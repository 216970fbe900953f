"""docs/tables.md, rendered from the table definitions themselves (a test keeps it current)."""

from __future__ import annotations

from torchdoctor.store.schema import ALL_TABLES

HEADER = """\
# Tables

Every table is in schema `python`, for a live process (`torchdoctor PID query "SQL"`) and for
a saved run (`torchdoctor query RUN_DIR "SQL"`) alike. Units are seconds and bytes; `time` is
Unix time in seconds. Live tables are taken when queried and are not saved. Generated from
`src/torchdoctor/store/schema.py`; do not edit by hand (`TORCHDOCTOR_UPDATE_DOCS=1 pytest
tests/unit/test_docs.py` rewrites it).
"""


def render_markdown() -> str:
    out = [HEADER]
    for spec in ALL_TABLES:
        kind = (
            "live, taken at query time"
            if spec.live
            else f"stored, up to {spec.capacity:,} rows in memory"
        )
        out.append(f"## `python.{spec.name}`\n\nOne row is {spec.doc} ({kind}).\n")
        out.append("| column | type | meaning |\n|---|---|---|")
        for col in spec.columns:
            null = ", NULL when unknown" if col.nullable else ""
            out.append(f"| `{col.name}` | {col.type}{null} | {col.doc} |")
        out.append("")
    return "\n".join(out)
