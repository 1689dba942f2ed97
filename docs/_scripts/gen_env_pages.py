"""Write one Markdown page per registered environment from its module docstring.

Every env module under ``llm_marl_envs/envs/`` opens with a Markdown docstring (a title, the table of
id, agents, turns, spaces, data, verifier and reward, then its arguments). This script copies it into
``docs/environments/list/<env id>.md``, and the docstrings of the protocol modules every family shares
(``debate``, ``writing``, ``coding``, ``information_split``) into ``docs/environments/protocols/<name>.md``.
``docs/conf.py`` runs it at the start of every build; the generated folders are ignored by git.

    python docs/_scripts/gen_env_pages.py            # writes the pages, prints what it wrote
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV_PACKAGE = "llm_marl_envs.envs"
PROTOCOL_MODULES = ("debate", "writing", "coding", "information_split")


def module_path(module: str) -> Path:
    """The source file of a module of this repository, from its dotted name."""
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def module_docstring(module: str) -> str:
    """The module's docstring, read without importing it."""
    text = ast.get_docstring(ast.parse(module_path(module).read_text(encoding="utf-8")))
    if not text:
        raise ValueError(f"{module} has no module docstring; every env module opens with its Markdown table")
    return text


def is_markdown_docstring(module: str) -> bool:
    """True for the env modules whose docstrings are Markdown pages (a ``# `` title on the first line)."""
    if not module.startswith(ENV_PACKAGE + "."):
        return False
    try:
        return module_docstring(module).startswith("# ")
    except (OSError, ValueError):
        return False


DOTTED_NAME = re.compile(r"`((?:llm_marl_envs|llm_marl|verifiers|trainers)(?:\.\w+)+)`")


def cross_references(line: str, relative_root: str) -> str:
    """Backquoted names of this library's objects become links: protocol modules to their pages, the rest to the API."""
    def link(match: re.Match) -> str:
        name = match.group(1)
        protocol = name.removeprefix(ENV_PACKAGE + ".")
        if protocol in PROTOCOL_MODULES:
            return f"[`{name}`]({relative_root}/protocols/{protocol}.md)"
        return f"{{py:obj}}`{name}`"
    return DOTTED_NAME.sub(link, line)


def as_page(docstring: str, source: str, note: str, relative_root: str = "..") -> str:
    """The docstring as a page: section headings one level below the title, names linked, and where it comes from."""
    lines = docstring.splitlines()
    in_code = False
    for index, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        elif not in_code:
            lines[index] = cross_references(line, relative_root)
    if not lines or not lines[0].startswith("# "):
        raise ValueError(f"{source}: the docstring must open with a '# ' title line, got {lines[:1]!r}")
    if not any(line.startswith("## ") for line in lines):        # "# title" then "### section" -> "## section"
        lines = [re.sub(r"^###(?=\s)", "##", line) for line in lines]
    lines[1:1] = ["", f"*{note} Generated from the docstring of `{source}`.*"]
    return "\n".join(lines).rstrip() + "\n"


def registered_envs() -> dict[str, str]:
    """``{env id: module}`` of every registered env whose entry point lives in this repository."""
    sys.path.insert(0, str(ROOT))
    import llm_marl_envs
    from llm_marl_envs.registry import spec

    envs = {}
    for env_id in llm_marl_envs.list_envs():
        entry = spec(env_id).entry_point
        if isinstance(entry, str) and entry.startswith(ENV_PACKAGE + "."):
            envs[env_id] = entry.partition(":")[0]
    return envs


def write_if_changed(path: Path, text: str) -> None:
    """Write ``text`` unless the file already holds it (keeps Sphinx's incremental builds incremental)."""
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def write_pages(out_dir: Path) -> list[Path]:
    """Write the env pages to ``out_dir`` and the protocol pages beside it; stale pages are removed."""
    protocol_dir = out_dir.parent / "protocols"
    written = []
    for folder, pages in (
        (out_dir, {env_id: (module, f"Environment `{env_id}`.") for env_id, module in registered_envs().items()}),
        (protocol_dir, {name: (f"{ENV_PACKAGE}.{name}", "Protocol shared by a family of environments.")
                        for name in PROTOCOL_MODULES}),
    ):
        folder.mkdir(parents=True, exist_ok=True)
        for name, (module, note) in pages.items():
            path = folder / f"{name}.md"
            source = str(module_path(module).relative_to(ROOT))
            write_if_changed(path, as_page(module_docstring(module), source, note))
            written.append(path)
        for stale in set(folder.glob("*.md")) - set(written):
            stale.unlink()
    return written


if __name__ == "__main__":
    for page in write_pages(ROOT / "docs" / "environments" / "list"):
        print(page.relative_to(ROOT))
