"""Files shipped with the package: run configs (``configs/``) and assets (``assets/``: the trained toy model and
prompt files). In the repository they sit at the top level; an installed package carries them inside itself
(``dit_sp/configs``, ``dit_sp/assets``: ``setup.py`` maps them there). They are found by name from any working
directory, installed or not."""

from __future__ import annotations

from pathlib import Path

from dit_sp.errors import MissingFileError

PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _data_dir(name: str) -> Path:
    installed = PACKAGE_DIR / name  # a wheel (non-editable install) carries it inside the package
    return installed if installed.is_dir() else PACKAGE_DIR.parent / name  # a checkout or an editable install


CONFIG_DIR = _data_dir("configs")
ASSET_DIR = _data_dir("assets")


def bundled_configs() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def _resolve(name: str | Path, root: Path, prefix: str, suffixes: tuple[str, ...]) -> Path | None:
    path = Path(name)
    if path.exists():
        return path.resolve()
    if path.is_absolute():
        return None
    relative = Path(*path.parts[1:]) if path.parts and path.parts[0] == prefix else path
    for suffix in suffixes:
        candidate = root / relative.with_name(relative.name + suffix)
        if candidate.exists():
            return candidate
    return None


def config_path(name: str | Path) -> Path:
    """A YAML run config: an existing path, or a bundled config by name (``grpo_toy``, ``grpo_toy.yaml`` or
    ``configs/grpo_toy.yaml``)."""
    found = _resolve(name, CONFIG_DIR, "configs", ("", ".yaml"))
    if found is None or not found.is_file():
        raise MissingFileError(f"config {str(name)!r}: no such file, and no bundled config of that name "
                                f"(bundled: {', '.join(bundled_configs())})")  # fmt: skip
    return found


def asset_path(name: str | Path) -> Path | None:
    """An existing path, or a bundled asset by name (``toy-wan``, ``toy_prompts_train.txt``, or the same under
    ``assets/``); ``None`` if neither exists."""
    return _resolve(name, ASSET_DIR, "assets", ("",))
