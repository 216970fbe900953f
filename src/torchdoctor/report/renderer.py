"""One interface for printing a run's findings: a Renderer per output format, each with
`render(findings) -> str`. A verb that prints findings picks one by its `--format` (`of`) and
hands it the findings read back (diagnose.record.Finding); a new format is a new subclass here
and a line in RENDERERS."""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import ClassVar

from torchdoctor._json import dumps
from torchdoctor.diagnose.record import Finding
from torchdoctor.report.cluster import render_diagnoses
from torchdoctor.report.diagnoses import block, gap, render_full


class Renderer(abc.ABC):
    name: ClassVar[str]

    @abc.abstractmethod
    def render(self, findings: Sequence[Finding]) -> str:
        """The findings in this format."""


class TextRenderer(Renderer):
    """For people: the findings as the story they tell (report/diagnoses.py)."""

    name = "text"

    def render(self, findings: Sequence[Finding]) -> str:
        return render_full(findings)


class JsonRenderer(Renderer):
    """For programs: each finding's row, the evidence an object (Finding.to_json)."""

    name = "json"

    def render(self, findings: Sequence[Finding]) -> str:
        return dumps([f.to_json() for f in findings], indent=2)


class JobTextRenderer(Renderer):
    """A job's findings for people: job-level ones once, each rank's own grouped by what they
    say, then the ranks that could not be asked (report/cluster.py)."""

    name = "text"

    def __init__(self, unreachable: dict[int, str] | None = None) -> None:
        self.unreachable = dict(unreachable or {})

    def render(self, findings: Sequence[Finding]) -> str:
        return render_diagnoses(list(findings), self.unreachable)


class MarkdownRenderer(Renderer):
    """For a notebook or an issue: each finding as a fenced block under its kind."""

    name = "markdown"

    def render(self, findings: Sequence[Finding]) -> str:
        if not findings:
            return "no problems found"
        return "\n\n".join(f"### {f.kind}\n\n```\n{block(f)}\n```" for f in findings)


RENDERERS: dict[str, type[Renderer]] = {
    r.name: r for r in (TextRenderer, JsonRenderer, MarkdownRenderer)
}


def of(fmt: str) -> Renderer:
    """The renderer of a `--format` choice."""
    return RENDERERS[fmt]()


def render_judged(
    renderer: Renderer,
    findings: Sequence[Finding],
    steps: Callable[[], int],
    failures: Sequence[str] = (),
) -> str:
    """The findings of a run, job or process; `steps()` counts its recorded steps, asked only
    where nothing was found; `failures`: parts of torchdoctor that failed while it recorded.
    None found over no step, or over a record with parts missing, is a gap, not a clean bill:
    people are told what was not judged (JSON stays the list, empty)."""
    if findings or renderer.name == "json":
        return renderer.render(findings)
    return gap(steps(), failures) or renderer.render(findings)
