"""An export that cannot be written (``dit_sp.rl.export``) names the path on every rank, leaves no ``.tmp``
and keeps the earlier export whole."""

from __future__ import annotations

import pytest
from checkpoint_checks import export_on_a_full_disk
from grpo_checks import tiny_config

from dit_sp import spawn


@pytest.mark.slow  # spawns workers that build a trainer
def test_a_full_disk_during_export_names_the_path_and_keeps_the_earlier_export(tmp_path):
    config = tiny_config(ulysses=2, output_dir=str(tmp_path / "run"), guidance=1.0)
    for result in spawn(export_on_a_full_disk, 2, args=(config, 2000), timeout=300):
        error = result["error"]
        assert error is not None and error.startswith("CheckpointWriteError: "), error
        assert f"cannot write {tmp_path / 'run' / 'final'}: File too large" in error and "\n" not in error
        assert "final.tmp" not in result["listing"] and "final" in result["listing"], result["listing"]
        assert result["same"], "the earlier export was changed"
