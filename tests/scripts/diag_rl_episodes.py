"""A healthy policy-gradient loop whose episodes grow as it learns: a pole to keep upright on
a line, one observation at a time, one update per episode with the loss summed over the
episode (as pytorch/examples' reinforce and actor_critic sum theirs). A random policy lets it
fall within ~15 moves; a learned one holds it for the 200 allowed. The loss and the gradient
norm grow with the episodes: neither is a learning curve nor an explosion there.

    python diag_rl_episodes.py [EPISODES]
"""

import sys

import torch
from torch import nn

torch.manual_seed(0)


class Pole:
    """An angle that falls away from upright by itself; each move pushes it one way or the
    other. Reward 1 per move it stays within 1; at most 200 moves."""

    def reset(self) -> torch.Tensor:
        self.angle, self.speed, self.t = 0.05, 0.0, 0
        return self.obs()

    def obs(self) -> torch.Tensor:
        return torch.tensor([self.angle * 5, self.speed * 20])

    def step(self, action: int) -> tuple[torch.Tensor, bool]:
        self.speed += 0.05 * self.angle + (0.02 if action == 1 else -0.02)
        self.angle += self.speed
        self.t += 1
        return self.obs(), abs(self.angle) > 1 or self.t >= 200


policy = nn.Sequential(nn.Linear(2, 32), nn.Tanh(), nn.Linear(32, 2))
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
env = Pole()
episodes = int(sys.argv[1]) if len(sys.argv) > 1 else 160
for episode in range(episodes):
    obs, done, log_probs = env.reset(), False, []
    while not done:
        dist = torch.distributions.Categorical(logits=policy(obs))
        action = dist.sample()
        log_probs.append(dist.log_prob(action))
        obs, done = env.step(int(action))
    # the reward-to-go of each move (1 a move survived), discounted
    returns, running = [], 0.0
    for _ in log_probs:
        running = 1.0 + 0.99 * running
        returns.insert(0, running)
    advantage = torch.tensor(returns)
    advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-6)
    loss = -(torch.stack(log_probs) * advantage).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if episode % 20 == 19:
        print(f"episode {episode + 1}: {len(log_probs)} moves", flush=True)
