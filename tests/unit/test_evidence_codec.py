"""Every diagnosis kind's evidence is a registered dataclass that goes through the one codec
(diagnose/evidence.py) and comes back equal, on the findings of the saved runs; rows written
by other versions (a key more, a key less, not an object) decode without raising; findings
read back print the same through the Renderer interface as their rows say."""

from __future__ import annotations

import json
import typing
from collections.abc import Callable
from pathlib import Path

from torchdoctor._json import dumps
from torchdoctor.config import Config
from torchdoctor.diagnose import MODULES, load_modules
from torchdoctor.diagnose.evidence import Evidence, decode, encode, kinds
from torchdoctor.diagnose.hang import HangEvidence
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.missing_rank import AbsentRank, MissingRankEvidence
from torchdoctor.diagnose.nan import NanEvidence
from torchdoctor.diagnose.parts import CollectiveCall
from torchdoctor.diagnose.record import Diagnosis, Finding
from torchdoctor.frames import StackFrame, ThreadStack
from torchdoctor.report import renderer
from torchdoctor.store.saved import open_run

RUNS = Path(__file__).resolve().parent.parent / "fixtures" / "runs"


def _saved_findings() -> list[Diagnosis]:
    found = []
    for run_dir in sorted(p for p in RUNS.iterdir() if (p / "meta.json").exists()):
        inputs = Inputs.of_saved(open_run(run_dir), Config())
        found += [d for m in load_modules() for d in m.diagnose(inputs)]
    return found


def test_every_kind_has_its_evidence_class() -> None:
    registered = kinds()
    assert set(MODULES) <= set(registered), set(MODULES) - set(registered)
    assert all(issubclass(cls, Evidence) and cls is not Evidence for cls in registered.values())
    for cls in registered.values():  # the codec builds parts from these: each must resolve
        typing.get_type_hints(cls)


def test_the_saved_runs_findings_round_trip_through_the_codec() -> None:
    found = _saved_findings()
    assert len({d.kind for d in found}) >= 15
    for d in found:
        assert type(d.evidence) is kinds()[d.kind], d.kind  # typed where it is made
        text = encode(d.evidence)
        back = decode(d.kind, text)
        assert type(back) is type(d.evidence)
        assert back.to_json() == json.loads(text), d.kind
        assert encode(back) == text  # stored again, the same text
        assert not back.extra, (d.kind, back.extra)  # every key is a field


def test_a_row_of_another_version_decodes() -> None:
    # A key this version does not know is kept (and written again after the known ones).
    newer = decode("hang", {"category": "lock", "seconds": 61.0, "ranked_by": "time"})
    assert isinstance(newer, HangEvidence)
    assert newer.category == "lock" and newer.extra == {"ranked_by": "time"}
    assert list(newer.to_json())[-1] == "ranked_by"
    # A key an older row lacks takes its default (None for a field without one).
    older = decode("hang", json.dumps({"category": "io"}))
    assert isinstance(older, HangEvidence) and older.threads is None and older.timeout is None
    # Text that is not a JSON object, nothing at all, a kind this version does not know.
    assert decode("nan", "not json").extra == {"text": "not json"}
    assert decode("nan", "[1, 2]").extra == {"value": [1, 2]}
    assert isinstance(decode("nan", None), NanEvidence)
    unknown = decode("a_kind_from_the_future", {"x": 1})
    assert type(unknown) is Evidence and unknown.to_json() == {"x": 1}


def test_parts_come_back_as_their_classes() -> None:
    frame = {"func": "load_batch", "file": "/job/train.py", "lineno": 22, "code": "x = q.get()"}
    main = {"thread_id": 1, "name": "MainThread", "is_main": True, "daemon": False}
    stored = {
        "category": "lock",
        "blocking_frame": frame | {"locals": 3},  # a key of a newer version's frame
        "user_frame": None,
        "collective": {"group": "default", "seq": 9, "op": "all_reduce", "shapes": [[65]],
                       "dtype": "float32", "site": "train.py:4", "step": 5, "waited": 7.0, "k": 1},
        "threads": [main | {"frames": [frame]}],
    }  # fmt: skip
    back = decode("hang", json.dumps(stored))
    assert isinstance(back, HangEvidence)
    # a plain dataclass part (frames.py) keeps its own fields: a newer key is dropped
    assert back.blocking_frame == StackFrame(**frame)
    assert back.user_frame is None
    [thread] = back.threads
    assert thread == ThreadStack(**main, frames=[StackFrame(**frame)])
    # a Record part keeps a key it does not know, and writes it again
    assert isinstance(back.collective, CollectiveCall) and back.collective.seq == 9
    assert back.collective.extra == {"k": 1}
    again = back.to_json()
    assert again["collective"] == stored["collective"] and again["threads"] == stored["threads"]
    # parts in a dict, by rank
    missing = decode("missing_rank", {"op": "all_reduce", "missing": {"3": {"status": "running",
                     "steps": 5, "stack": [frame], "category": "lock"}}})  # fmt: skip
    assert isinstance(missing, MissingRankEvidence)
    assert isinstance(missing.missing["3"], AbsentRank)
    assert missing.missing["3"].stack == [StackFrame(**frame)]
    assert missing.missing["3"].line is None and "line" not in missing.to_json()["missing"]["3"]
    # a part of another shape stays as it came, and nothing raises
    odd = decode("hang", {"blocking_frame": "train.py:3", "threads": [1, "x"]})
    assert isinstance(odd, HangEvidence) and odd.blocking_frame == "train.py:3"


def test_a_job_findings_identity_travels_in_its_evidence() -> None:
    d = Diagnosis("straggler", "warning", "Rank 1 is slow", rank=1, job=True, key="straggler:1")
    stored = json.loads(d.row()[7])
    assert stored["job_key"] == "straggler:1"
    finding = Finding.of(d)
    assert finding.job_key == "straggler:1"
    assert finding.to_json()["evidence"]["job_key"] == "straggler:1"  # as JSON output shows it


def test_the_renderers_print_findings_read_back() -> None:
    found = [Finding.of(d) for d in _saved_findings()[:6]]
    assert set(renderer.RENDERERS) == {"text", "json", "markdown"}
    text = renderer.of("text").render(found)
    rows = json.loads(renderer.of("json").render(found))
    assert [r["kind"] for r in rows] == [f.kind for f in found]
    assert all(f"[{r['severity']}] {r['kind']}" in text for r in rows)
    assert rows[0]["evidence"] == found[0].evidence.to_json()
    assert renderer.of("markdown").render(found).count("```") == 2 * len(found)
    assert renderer.of("text").render([]) == "no problems found"


def test_no_finding_over_no_step_is_said_to_be_unjudged() -> None:
    nothing = "nothing judged: the training diagnoses need recorded steps"
    asked: list[int] = []

    def steps(n: int) -> Callable[[], int]:
        return lambda: asked.append(n) or n

    for fmt in ("text", "markdown"):
        assert renderer.render_judged(renderer.of(fmt), [], steps(0)) == nothing
    assert renderer.render_judged(renderer.JobTextRenderer(), [], steps(0)) == nothing
    assert renderer.render_judged(renderer.of("text"), [], steps(3)) == "no problems found"
    assert asked == [0, 0, 0, 3]
    # JSON, and findings (made before any step: shown), never ask for the steps
    assert renderer.render_judged(renderer.of("json"), [], steps(0)) == "[]"
    found = [Finding.of(d) for d in _saved_findings()[:1]]
    text = renderer.of("text")
    assert renderer.render_judged(text, found, steps(0)) == text.render(found)
    assert asked == [0, 0, 0, 3]


def test_the_one_encoder_takes_what_json_has_no_form_for() -> None:
    # The C encoder's answer where it has one; the careful pass for non-finite floats and keys.
    assert dumps({"a": [1, 2.5, None, True]}) == json.dumps({"a": [1, 2.5, None, True]})
    assert dumps({"loss": float("nan"), "norm": float("-inf")}) == '{"loss": "nan", "norm": "-inf"}'
    assert dumps({(1, 2): Path("/x")}) == '{"(1, 2)": "/x"}'
    assert dumps([Path("/x")], indent=1) == '[\n "/x"\n]'
