"""lint.grad_switch.switch_off: the line that switched autograd off for the code that failed,
read from the sources of a real traceback's frames (the crash's first fix names it)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from torchdoctor.failure import frames_of
from torchdoctor.lint.grad_switch import switch_off

# each source raises at the line marked `# fails`; the switch expected: its text, or None
CASES = {
    "around": (
        "import torch\n"
        "def train():\n"
        "    raise RuntimeError  # fails\n"
        "with torch.no_grad():  # evaluation style\n"
        "    train()\n",
        "with torch.no_grad():",
    ),
    "decorator": (
        "import torch\n"
        "@torch.inference_mode()\n"
        "def step():\n"
        "    raise RuntimeError  # fails\n"
        "step()\n",
        "@torch.inference_mode()",
    ),
    "above_in_the_function": (
        "import torch\n"
        "def step():\n"
        "    with torch.set_grad_enabled(False):\n"
        "        out = 1\n"
        "    raise RuntimeError  # fails\n"
        "step()\n",
        "with torch.set_grad_enabled(False):",
    ),
    # a block around a frame wins over one above the failing line in an inner function
    "around_before_above": (
        "import torch\n"
        "def step():\n"
        "    with torch.no_grad():\n"
        "        pass\n"
        "    raise RuntimeError  # fails\n"
        "with torch.no_grad(): step()\n",
        "with torch.no_grad():",
    ),
    "inference_mode_false_is_grad_on": (
        "import torch\nwith torch.inference_mode(False):\n    raise RuntimeError  # fails\n",
        None,
    ),
    "enable_grad": (
        "import torch\nwith torch.enable_grad():\n    raise RuntimeError  # fails\n",
        None,
    ),
    "a_function_defined_above_is_not_this_code": (
        "import torch\n"
        "def evaluate():\n"
        "    with torch.no_grad():\n"
        "        pass\n"
        "raise RuntimeError  # fails\n",
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_switch_is_found_in_the_source(name: str, tmp_path: Path) -> None:
    source, expected = CASES[name]
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    with pytest.raises(RuntimeError) as caught:
        runpy.run_path(str(path))
    frames = reversed(frames_of(caught.value))  # innermost first, as the crash asks
    places = [(f.f_code.co_filename, f.f_lineno, f.f_code.co_name) for f in frames]
    site = switch_off([p for p in places if p[0] == str(path)])
    if expected is None:
        assert site is None, site
        return
    assert site is not None and site[2] == expected, site
    assert site[0] == str(path)
    lines = source.splitlines()
    assert lines[site[1] - 1].lstrip().startswith(expected.rstrip(":").split("(")[0])
    if name == "around_before_above":  # the module's block (line 6), not step()'s (line 3)
        assert site[1] == 6, site
