"""Reinforcement learning that is right, which the silent-error checks must leave alone: an
actor-critic updated once per episode on a small deterministic environment (every episode
starts from the same observation), a target critic kept in eval mode and out of the
optimizer, no DataLoader."""

import copy

import torch
from torch import nn

torch.manual_seed(0)


class Walk:
    """Walk a line from 0; reward 1 at +5, the episode ends at +-5 or after 30 moves."""

    def reset(self) -> torch.Tensor:
        self.x, self.t = 0, 0
        return self.obs()

    def obs(self) -> torch.Tensor:
        return torch.tensor([self.x / 5.0, self.t / 30.0])

    def step(self, action: int) -> tuple[torch.Tensor, float, bool]:
        self.x += 1 if action == 1 else -1
        self.t += 1
        done = abs(self.x) >= 5 or self.t >= 30
        return self.obs(), float(self.x >= 5), done


policy = nn.Sequential(nn.Linear(2, 32), nn.Tanh(), nn.Linear(32, 2))
critic = nn.Sequential(nn.Linear(2, 32), nn.Tanh(), nn.Linear(32, 1))
target = copy.deepcopy(critic).eval()
for p in target.parameters():
    p.requires_grad_(False)
optimizer = torch.optim.Adam([*policy.parameters(), *critic.parameters()], lr=3e-3)
env = Walk()
for episode in range(60):
    obs, done = env.reset(), False
    log_probs, values, rewards, nexts = [], [], [], []
    while not done:
        dist = torch.distributions.Categorical(logits=policy(obs))
        action = dist.sample()
        nxt, reward, done = env.step(int(action))
        log_probs.append(dist.log_prob(action))
        values.append(critic(obs).squeeze())
        with torch.no_grad():
            nexts.append(0.0 if done else float(target(nxt)))
        rewards.append(reward)
        obs = nxt
    returns = torch.tensor([r + 0.99 * n for r, n in zip(rewards, nexts, strict=True)])
    values_t = torch.stack(values)
    advantage = (returns - values_t).detach()
    loss = -(torch.stack(log_probs) * advantage).mean() + (returns - values_t).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if episode % 10 == 9:
        target.load_state_dict(critic.state_dict())
