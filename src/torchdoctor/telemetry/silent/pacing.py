"""Which steps the silent-error checks look at, and a budget that keeps them cheap.

Always sampled: steps 1, 2 and 3, and the three steps after the primary optimizer's first
update where that came late (a loop whose first steps were told from the gradient reset).
Then pairs of consecutive steps (the checks that compare a step with the next need two), the
first at step PERIOD. The next pair comes PERIOD steps later, or later still when the last pair
cost more than BUDGET of the training time: a sampled step of a tiny model costs a few times an
ordinary one (its checks are a fixed number of small tensor operations), and every 50 steps
that would be several percent of the run. So a pair's extra time is measured (its steps'
durations, less their DataLoader waits, against the step before it) and the pairs spread out
until the checks average BUDGET; a large model's pairs stay PERIOD apart. `budget=None` keeps
the pairs PERIOD apart whatever they cost (the tests that need a periodic pair at a known step).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchdoctor.telemetry.step import StepState

PERIOD = 50  # steps from one periodic pair to the next, at the least
BUDGET = 0.01  # the share of the training time the periodic pairs may take
MAX_PERIOD = 5000  # ... and at the most (a pair measured in a stall reads as costly)


class Pacing:
    def __init__(self, budget: float | None = BUDGET) -> None:
        self.budget = budget
        self.first_update: int | None = None  # the step of the primary optimizer's first update
        self.pair = PERIOD  # the first step of the next periodic pair
        self._before: float | None = None  # the busy time of the step before the pair
        self._extra = 0.0  # the pair's busy time so far, less _before's per step

    def sampled(self, step: int) -> bool:
        return 1 <= step <= 3 or 0 <= step - self.pair <= 1 or self._after_update(step)

    def full(self, step: int) -> bool:
        """Every check looks at `step`: on the second step of a pair only those that compare
        it with the first one do (the gradient reset, the batches)."""
        return 1 <= step <= 3 or step == self.pair or self._after_update(step)

    def next_sampled(self, n: int) -> int:
        """The first sampled step after `n`."""
        for following in (n + 1, n + 2, n + 3):
            if self.sampled(following):
                return following
        return max(self.pair, n + 1)

    def step_ended(self, state: StepState, step: int, now: float) -> None:
        """Step `step` (its StepState) ended; `now` is perf_counter() time. The step before a
        pair and the pair's own are measured; after the pair's second step the next pair is
        placed."""
        pair = self.pair
        if step > pair + 1:  # passed unseen (the checks were off): the next one from here
            self.pair, self._before = step + PERIOD, None
            return
        if step < pair - 1:
            return
        start = state.start
        busy = None if start is None else now - start - state.phases["data_wait"]
        if step == pair - 1:
            self._before, self._extra = busy, 0.0
            return
        before = self._before
        if busy is not None and before is not None:
            self._extra += busy - before
        if step == pair:
            return
        gap = PERIOD
        if self.budget is not None and before is not None and before > 0:
            gap = min(MAX_PERIOD, max(PERIOD, math.ceil(self._extra / (self.budget * before))))
        self.pair = pair + gap
        self._before = None

    def _after_update(self, step: int) -> bool:
        first = self.first_update
        return first is not None and 1 <= step - first <= 3
