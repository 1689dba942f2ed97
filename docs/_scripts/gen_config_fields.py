"""Write ``docs/config_fields.md``: every field of the trainers' configs with its flag, type, default and help.

The tables are read from the config dataclasses (``TrainerConfig``, ``MAGRPOConfig``, ``MAPPOConfig``),
the same source as ``llm-marl train ALGORITHM --help``, so the page cannot drift from the code.
``docs/conf.py`` runs it at the start of every build; git ignores the page.

    python docs/_scripts/gen_config_fields.py        # writes the page, prints its path
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from trainers.common.arguments import config_fields, describe, field_default, format_value  # noqa: E402
from trainers.common.config import TrainerConfig  # noqa: E402
from trainers.magrpo.config import MAGRPOConfig  # noqa: E402
from trainers.mappo.config import MAPPOConfig  # noqa: E402

ALGORITHMS = {"MAGRPO": MAGRPOConfig, "MAPPO": MAPPOConfig}


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def code(value: str) -> str:
    """An inline code span of any text (backticks inside are fenced by longer runs)."""
    fence = "``" if "`" in value else "`"
    return f"{fence}{value}{fence}" if value else "(empty)"


def table(config_cls: type, names: list[str], defaults: dict[str, str] | None = None) -> str:
    """Rows of ``names``: field, flag, type, default (``defaults`` overrides the shown one) and help."""
    fields = config_fields(config_cls)
    rows = ["| field | flag | type | default | help |", "|---|---|---|---|---|"]
    for name in names:
        kind, field = fields[name]
        default = (defaults or {}).get(name) or code(format_value(field_default(field)))
        rows.append(f"| `{name}` | `--{name.replace('_', '-')}` | {cell(describe(kind))} | {cell(default)} | "
                    f"{cell(field.metadata.get('help', ''))} |")
    return "\n".join(rows)


def page() -> str:
    """The whole page: the fields both trainers share (same help), then each algorithm's own."""
    shared = [name for name in config_fields(TrainerConfig)
              if len({config_fields(cls)[name][1].metadata.get("help") for cls in ALGORITHMS.values()}) == 1]
    shown = {}
    for name in shared:
        values = {algo: format_value(field_default(config_fields(cls)[name][1])) for algo, cls in ALGORITHMS.items()}
        if len(set(values.values())) > 1:
            shown[name] = ", ".join(f"{algo}: {code(v)}" for algo, v in values.items())
    parts = ["# Config fields", "",
             "Every field of the trainers' configs, read from the config dataclasses (the same text as "
             "`llm-marl train magrpo --help` and `llm-marl train mappo --help`). A field is set by its flag, "
             "by a YAML recipe (`--config`) or by `--set field=value`: see [Configs and the command line]"
             "(configs.md).", "",
             "## Shared by both trainers (`TrainerConfig`)", "", table(TrainerConfig, shared, shown), ""]
    for algo, cls in ALGORITHMS.items():
        own = [name for name in config_fields(cls) if name not in shared]
        parts += [f"## {algo} (`{cls.__module__}.{cls.__name__}`)", "", table(cls, own), ""]
    return "\n".join(parts)


def write_page(path: Path) -> Path:
    """Write the page to ``path`` (only when its text changed, so a rebuild does not re-read it)."""
    text = page()
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path


if __name__ == "__main__":
    print(write_page(ROOT / "docs" / "config_fields.md").relative_to(ROOT))
