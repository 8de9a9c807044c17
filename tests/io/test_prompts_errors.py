"""A prompt file that is not UTF-8 (saved as Latin-1 or UTF-16 by an editor) is one line naming the file, the
line and the byte offset, and saying to save it as UTF-8; a UTF-8 byte-order mark is not part of a prompt."""

from __future__ import annotations

import pytest

from dit_sp.errors import ConfigError
from dit_sp.io.prompts import read_prompt_file, read_prompts


@pytest.mark.parametrize(
    ("name", "data", "where"),
    [
        ("p.txt", b"a red circle\nbad \xff byte\n", r"p.txt:2: byte 0xff at offset 17 "),
        ("p.jsonl", b'{"prompt": "a"}\n\n{"prompt": "caf\xe9"}\n', r"p.jsonl:3: byte 0xe9 at offset 32 "),
        ("utf16.txt", "a red circle\n".encode("utf-16"), r"utf16.txt:1: byte 0xff at offset 0 "),
    ],
    ids=["latin1-txt", "latin1-jsonl", "utf16"],
)
def test_a_prompt_file_that_is_not_utf8_is_one_line_naming_where(tmp_path, name, data, where):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(ConfigError, match=where + r"is not UTF-8 text; save the file as UTF-8$") as error:
        read_prompt_file(tmp_path / name)
    assert str(tmp_path / name) in str(error.value) and "\n" not in str(error.value)


def test_a_byte_order_mark_is_not_part_of_the_first_prompt(tmp_path):
    (tmp_path / "bom.txt").write_bytes("\ufeffa red circle\na blue square\n".encode())
    (tmp_path / "bom.jsonl").write_bytes('\ufeff{"prompt": "a red circle"}\n'.encode())
    assert read_prompts(tmp_path / "bom.txt") == ["a red circle", "a blue square"]
    assert read_prompts(tmp_path / "bom.jsonl") == ["a red circle"]
