"""eval semantics: output, final expression, errors; capture is per thread."""

from __future__ import annotations

import io
import sys
import threading

from torchdoctor.probe.evaluator import evaluate


def test_output_value_and_error() -> None:
    ns: dict = {}
    result = evaluate("print('a')\ny = 2\ny * 21", ns)
    assert (result.output, result.value, result.error) == ("a\n", "42", None)
    assert ns["y"] == 2
    assert evaluate("None", ns).value is None
    result = evaluate("undefined_name", ns)
    assert result.error and "NameError" in result.error and "evaluator.py" not in result.error


def test_capture_does_not_steal_other_threads_output() -> None:
    other = io.StringIO()
    original = sys.stdout
    started, release = threading.Event(), threading.Event()

    def chatter() -> None:
        started.set()
        release.wait()
        print("from the training thread")

    thread = threading.Thread(target=chatter)
    sys.stdout = other
    try:
        thread.start()
        started.wait()
        code = "import threading\nprint('from eval')\nrelease.set()\nworker.join()"
        result = evaluate(code, {"release": release, "worker": thread})
    finally:
        sys.stdout = original
    assert result.output == "from eval\n"
    assert other.getvalue() == "from the training thread\n"
