"""Is a step a rollout: an environment's observations fed to the model one at a time between
two updates?

A policy-gradient loop (pytorch/examples' reinforce and actor_critic) calls its policy once per
environment step, each time on one observation, and updates once per episode with a loss summed
over the episode. That loss, and the gradient norm, grow with the episode's length, which grows
as the policy learns (CartPole's episodes go from 10 steps to hundreds): a loss that does not
fall, or a norm ten times its usual size, says nothing there of learning or of exploding (the
return does, and torchdoctor does not see it). A DQN acts the same way between its updates.
Read from the traced steps' calls of the outermost modules (python.shapes); a loop that calls
its model on batches (gradient accumulation, several crops, a GAN) is not one, however often.
"""

from __future__ import annotations

import numpy as np

from torchdoctor.diagnose.inputs import Inputs

MIN_CALLS = 4  # calls of an outermost module on one observation within one traced step


def is_rollout(inputs: Inputs) -> bool:
    shapes = inputs.shapes
    if not shapes.rows:
        return False
    roots = shapes.data["depth"] == 0
    # a live run asks once a second: each distinct input text is parsed once, not each call
    texts, which = np.unique(shapes.data["input_shapes"][roots], return_inverse=True)
    one = np.array([one_observation(t) for t in texts.tolist()], dtype=bool)[which]
    _steps, calls = np.unique(shapes.data["step"][roots][one], return_counts=True)
    return bool(calls.size) and int(calls.max()) >= MIN_CALLS


def one_observation(input_shapes: str) -> bool:
    """The call's first tensor is one sample: of one dimension ([4]), or a batch of one
    ([1, 4], [1, 4, 84, 84]). `input_shapes` as python.shapes writes it: "[1, 4], [1]"."""
    first = input_shapes.split("]", 1)[0].lstrip("[ ")
    try:
        dims = [int(d) for d in first.split(",") if d.strip()]
    except ValueError:
        return False
    return len(dims) == 1 or (len(dims) > 1 and dims[0] == 1)
