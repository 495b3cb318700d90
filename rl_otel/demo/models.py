"""The demo's models: a tiny autoregressive policy (also the frozen reference), a per-token critic, and an
offloader that moves a model's (and its optimizer's) state out of the process and back, as RL frameworks do
between phases to share one GPU.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch
from torch import nn

from rl_otel.demo.task import EOS, CountingTask


class _Trunk(nn.Module):
    """Embeds (prompt, position, previous token) and mixes them: the state of one decoding step."""

    def __init__(self, task: CountingTask, hidden: int) -> None:
        super().__init__()
        self.prompt = nn.Embedding(task.num_prompts, hidden)
        self.pos = nn.Embedding(task.response_len, hidden)
        self.prev = nn.Embedding(task.vocab + 1, hidden)  # index vocab: "no previous token" (BOS)
        self.mlp = nn.Sequential(nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                                 nn.Tanh())
        self.bos = task.vocab

    def forward(self, prompts: torch.Tensor, prev: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.prompt(prompts) + self.pos(pos) + self.prev(prev))

    def teacher_forced(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """Hidden states of every position of ``responses`` at once: ``(n, T, hidden)``."""
        n, t = responses.shape
        prev = torch.cat([torch.full((n, 1), self.bos, dtype=responses.dtype), responses[:, :-1]], dim=1)
        pos = torch.arange(t).expand(n, t)
        return self(prompts[:, None].expand(n, t), prev, pos)


class Policy(nn.Module):
    """An autoregressive policy over the task's vocabulary (a one-layer-deep stand-in for an LLM)."""

    def __init__(self, task: CountingTask, hidden: int = 256) -> None:
        super().__init__()
        self.task = task
        self.trunk = _Trunk(task, hidden)
        self.head = nn.Linear(hidden, task.vocab)

    def logits(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk.teacher_forced(prompts, responses))

    def log_probs(self, prompts: torch.Tensor, responses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probabilities of ``responses`` and the per-token entropy, ``(n, T)`` each."""
        logp_all = torch.log_softmax(self.logits(prompts, responses), dim=-1)
        logp = logp_all.gather(-1, responses.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy

    @torch.no_grad()
    def generate(self, prompts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Sample ``(n, response_len)`` tokens; after an EOS the rest is EOS padding (masked out later)."""
        n, t_max = prompts.shape[0], self.task.response_len
        prev = torch.full((n,), self.trunk.bos, dtype=torch.long)
        done = torch.zeros(n, dtype=torch.bool)
        out = torch.empty(n, t_max, dtype=torch.long)
        for t in range(t_max):
            logits = self.head(self.trunk(prompts, prev, torch.full((n,), t, dtype=torch.long)))
            token = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(1)
            token = torch.where(done, torch.full_like(token, EOS), token)
            out[:, t] = token
            done |= token == EOS
            prev = token
        return out


class Critic(nn.Module):
    """A value per response token."""

    def __init__(self, task: CountingTask, hidden: int = 256) -> None:
        super().__init__()
        self.trunk = _Trunk(task, hidden)
        self.head = nn.Linear(hidden, 1)

    def forward(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk.teacher_forced(prompts, responses)).squeeze(-1)


class Offloader:
    """Moves a model's parameters and/or an optimizer's state to a file and frees them, then back.

    ``offload()`` saves the tensors with ``torch.save`` and replaces each parameter's storage with an empty tensor,
    so the process's resident memory really drops; ``onload()`` restores them into the same ``Parameter``
    objects (the optimizer keeps pointing at them). Between the two the model must not be used.
    """

    def __init__(self, model: nn.Module | None, path: str | os.PathLike,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
        self.model, self.optimizer, self.path = model, optimizer, Path(path)
        self.offloaded = False

    def offload(self) -> None:
        if self.offloaded:
            return
        state = {"params": {k: p.data for k, p in self._params()},
                 "optim": self.optimizer.state_dict() if self.optimizer is not None else None}
        torch.save(state, self.path)
        for _, p in self._params():
            p.data = torch.empty(0, dtype=p.dtype)
        if self.optimizer is not None:
            self.optimizer.state.clear()
        _release_freed_memory()
        self.offloaded = True

    def onload(self) -> None:
        if not self.offloaded:
            return
        state = torch.load(self.path, weights_only=True)
        for k, p in self._params():
            p.data = state["params"][k]
        if self.optimizer is not None and state["optim"] is not None:
            self.optimizer.load_state_dict(state["optim"])
        self.path.unlink(missing_ok=True)
        self.offloaded = False

    def _params(self) -> list[tuple[str, nn.Parameter]]:
        return list(self.model.named_parameters()) if self.model is not None else []


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def _release_freed_memory() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them otherwise, and RSS would not show the offload)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
