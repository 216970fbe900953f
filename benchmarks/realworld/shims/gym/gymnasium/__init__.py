"""A stand-in for gymnasium: CartPole-v1 only, written from the cart-pole equations of motion
(Barto, Sutton and Anderson, 1983; Euler steps of 0.02 s), with gymnasium's API (reset(seed),
step -> obs, reward, terminated, truncated, info; env.spec.reward_threshold).

To keep a run short, the episode limit and the reward threshold come from the environment
(REALWORLD_CARTPOLE_MAX_STEPS, REALWORLD_CARTPOLE_THRESHOLD). When REALWORLD_COUNTER names a
file, each reset appends a line to it: the harness counts episodes (= optimizer steps of the
REINFORCE examples) from it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

__version__ = "0.0.0+realworld-shim"


@dataclass
class EnvSpec:
    id: str
    reward_threshold: float
    max_episode_steps: int


class CartPoleEnv:
    gravity = 9.8
    cart_mass = 1.0
    pole_mass = 0.1
    half_length = 0.5
    force = 10.0
    dt = 0.02
    theta_limit = 12 * 2 * math.pi / 360
    x_limit = 2.4

    def __init__(self, spec: EnvSpec) -> None:
        self.spec = spec
        self._rng = np.random.RandomState()
        self._state = np.zeros(4)
        self._t = 0

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        if seed is not None:
            self._rng = np.random.RandomState(seed)
        self._state = self._rng.uniform(-0.05, 0.05, size=4)
        self._t = 0
        counter = os.environ.get("REALWORLD_COUNTER")
        if counter:
            with open(counter, "a") as fh:
                fh.write("reset\n")
        return self._state.astype(np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        x, x_dot, theta, theta_dot = self._state
        f = self.force if action == 1 else -self.force
        total = self.cart_mass + self.pole_mass
        pm_l = self.pole_mass * self.half_length
        cos, sin = math.cos(theta), math.sin(theta)
        tmp = (f + pm_l * theta_dot**2 * sin) / total
        theta_acc = (self.gravity * sin - cos * tmp) / (
            self.half_length * (4.0 / 3.0 - self.pole_mass * cos**2 / total)
        )
        x_acc = tmp - pm_l * theta_acc * cos / total
        x, x_dot = x + self.dt * x_dot, x_dot + self.dt * x_acc
        theta, theta_dot = theta + self.dt * theta_dot, theta_dot + self.dt * theta_acc
        self._state = np.array([x, x_dot, theta, theta_dot])
        self._t += 1
        terminated = bool(abs(x) > self.x_limit or abs(theta) > self.theta_limit)
        truncated = self._t >= self.spec.max_episode_steps
        return self._state.astype(np.float32), 1.0, terminated, truncated, {}

    def render(self) -> None:
        return None

    def close(self) -> None:
        return None


def make(env_id: str, render_mode: str | None = None, **_: Any) -> CartPoleEnv:
    if env_id != "CartPole-v1":
        raise ValueError(f"the realworld gymnasium shim has only CartPole-v1, not {env_id}")
    spec = EnvSpec(
        env_id,
        reward_threshold=float(os.environ.get("REALWORLD_CARTPOLE_THRESHOLD", "475")),
        max_episode_steps=int(os.environ.get("REALWORLD_CARTPOLE_MAX_STEPS", "500")),
    )
    return CartPoleEnv(spec)
