"""Worker-side batch checks: prompts generated one by one, in one process."""

from __future__ import annotations

from dit_sp import GenerateConfig, generate


def one_by_one(configs: list[GenerateConfig]) -> list:
    return [generate(config, True)["frames"] for config in configs]
