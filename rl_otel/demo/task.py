"""The demo's task: count up from the prompt. A learnable reward with LLM-shaped rollouts.

A prompt is one token ``p``; the right response is ``1 + (p + t) % (vocab - 1)`` at position ``t`` for ``t`` in
``0..response_len-1``. Token 0 is end-of-sequence, so responses have variable lengths and a mask, as in an LLM
rollout. The score is the fraction of the ``response_len`` positions answered right before the EOS: a random
policy scores about ``1/vocab``, the optimal one 1.0, so the reward curve has a long way to rise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

EOS = 0


@dataclass(frozen=True)
class CountingTask:
    """Prompts, targets and scores of the counting task."""

    vocab: int = 12
    response_len: int = 6
    num_prompts: int = 11

    def __post_init__(self) -> None:
        if self.vocab < 3 or self.response_len < 1 or self.num_prompts < 1:
            raise ValueError(f"vocab >= 3, response_len >= 1, num_prompts >= 1; got {self}")

    def sample_prompts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return torch.randint(0, self.num_prompts, (n,), generator=generator)

    def targets(self, prompts: torch.Tensor) -> torch.Tensor:
        """``(n, response_len)`` right tokens (never EOS)."""
        t = torch.arange(self.response_len)
        return 1 + (prompts[:, None] + t[None, :]) % (self.vocab - 1)

    def response_mask(self, responses: torch.Tensor) -> torch.Tensor:
        """1.0 up to and including the first EOS (the EOS is a generated token too), 0.0 after it."""
        eos = (responses == EOS).float()
        before = torch.cumsum(eos, dim=1) - eos  # EOS tokens strictly before each position
        return (before == 0).float()

    def score(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """Fraction of positions answered right before the first EOS, in [0, 1]."""
        right = (responses == self.targets(prompts)).float() * self.response_mask(responses)
        return right.sum(dim=1) / self.response_len
