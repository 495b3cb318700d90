"""Every way a tensor's values reach Python, counted: what the statistics' one-host-read tests assert on."""

from __future__ import annotations

import pytest
import torch

HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


def count_host_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Patch ``torch.Tensor``'s readers (undone by ``monkeypatch``); the returned list gets each call's name."""
    calls: list[str] = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    return calls
