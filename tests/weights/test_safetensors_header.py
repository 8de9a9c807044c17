"""A damaged weights file is one line naming it, found from its header and size alone (nothing loaded): a
download cut short, a foreign file under the name, a shard index that lists a shard that is not there."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from dit_sp.errors import ConfigError, MissingFileError
from dit_sp.weights import SafetensorsCheckpoint
from dit_sp.weights.loading import safetensors_header, weight_files


@pytest.fixture
def weights(tmp_path):
    path = tmp_path / "diffusion_pytorch_model.safetensors"
    save_file({"a.weight": torch.arange(12.0).reshape(3, 4), "b.bias": torch.ones(5)}, path)
    return path


def test_a_whole_file_reads_and_a_cut_one_is_named(weights):
    header, start = safetensors_header(weights)
    assert set(header) == {"a.weight", "b.bias"} and start > 8
    assert torch.equal(SafetensorsCheckpoint(weights.parent).read("a.weight", (slice(1, 3),)),
                       torch.arange(4.0, 12.0).reshape(2, 4))  # fmt: skip
    data = weights.read_bytes()
    weights.write_bytes(data[:-8])
    with pytest.raises(ConfigError, match=r"safetensors is damaged: truncated: tensor '\w\.\w+' ends at byte"):
        SafetensorsCheckpoint(weights.parent)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", r"not a safetensors file, or truncated \(0 bytes"),
        (b"<html>404 Not Found</html>", r"not a safetensors file, or truncated"),
        ((6).to_bytes(8, "little") + b"{nope}", r"its header is not the JSON table of a safetensors file"),
        ((2).to_bytes(8, "little") + b"[]", r"its header is not the JSON table"),
        ((19).to_bytes(8, "little") + b'{"w": {"dtype": 1}}', r"tensor 'w' has no valid data_offsets"),
    ],
    ids=["empty", "html", "not-json", "not-a-table", "no-offsets"],
)
def test_a_foreign_file_is_one_line_naming_it(weights, data, message):
    weights.write_bytes(data)
    with pytest.raises(ConfigError, match=message) as error:
        safetensors_header(weights)
    assert str(weights) in str(error.value) and "save or download it again" in str(error.value)


def test_a_shard_index_names_what_is_missing_or_damaged(weights):
    index = weights.parent / "diffusion_pytorch_model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a.weight": weights.name, "b.bias": "part-2.safetensors"}}))
    with pytest.raises(MissingFileError, match=r"lists shards that are not in .*: \['part-2.safetensors'\]"):
        SafetensorsCheckpoint(weights.parent)
    index.write_text('{"weight_map": ')
    with pytest.raises(ConfigError, match=r"index.json is damaged: not a JSON shard index with a weight_map"):
        weight_files(weights.parent)
