"""LoRA without peft installed is one line naming the package and its pip extra, not peft's ImportError."""

from __future__ import annotations

import sys

import pytest
import torch

from dit_sp.errors import ConfigError, MissingPackageError
from dit_sp.train.lora import add_lora


def test_lora_without_peft_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # as if never installed: import fails, find_spec finds none
    model = torch.nn.Linear(4, 4)
    with pytest.raises(MissingPackageError, match=r"needs the peft package: pip install 'dit-sp\[lora\]'") as error:
        add_lora(model, rank=4)
    assert isinstance(error.value, ConfigError) and isinstance(error.value, ImportError)
    assert all(p.requires_grad for p in model.parameters()), "nothing was changed before the check"
