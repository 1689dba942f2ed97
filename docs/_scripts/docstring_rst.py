"""Adapt the docstring conventions of this code base to reStructuredText before autodoc renders them.

The docstrings are reST with Sphinx roles, plus three habits docutils does not read as intended:

- Markdown pipe tables (``| a | b |`` over ``|---|---|``), as in the env and reward modules: turned
  into ``list-table`` directives;
- grouped parameter blocks in the style of TRL's configs (``Parameters that control X:`` followed by
  indented lines whose long entries continue on a deeper hanging indent): the group title becomes the
  term of a definition list and continuation lines join their entry's indentation;
- text next to a literal (````DTensor````s) and vertical bars meant as text (``|a ∩ b|``): escaped.

``docs/conf.py`` runs :func:`to_rst` on every docstring autodoc renders.
"""
from __future__ import annotations

import re

TABLE_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)+\|?\s*$")
LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)]|#\.)\s")
LITERAL = re.compile(r"``[^`]+``([A-Za-z0-9_]?)")          # every literal, in order, and a character glued to it
TEXT_BARS = re.compile(r"(?<![\w`\\|])\|(?=[^\s|])([^|`]*?[^\s|])\|(?![\w`|])")


def indent_of(line: str) -> int:
    return len(line) - len(line.lstrip())


def table_cells(line: str) -> list[str]:
    """The cells of one Markdown table row."""
    row = line.strip()
    row = row[1:] if row.startswith("|") else row
    row = row[:-1] if row.endswith("|") else row
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", row)]


def markdown_tables(lines: list[str]) -> list[str]:
    """Markdown pipe tables (a header row, a ``---`` separator row, body rows) as ``list-table`` directives."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        if i + 1 < len(lines) and "|" in lines[i] and TABLE_SEPARATOR.match(lines[i + 1]):
            pad = " " * indent_of(lines[i])
            rows = [table_cells(lines[i])]
            i += 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append(table_cells(lines[i]))
                i += 1
            width = len(rows[0])
            if out and out[-1].strip():
                out.append("")
            out += [f"{pad}.. list-table::", f"{pad}   :header-rows: 1", ""]
            for row in rows:
                row = (row + [""] * width)[:width]
                out.append(f"{pad}   * - {row[0] or ' '}")
                out += [f"{pad}     - {cell or ' '}" for cell in row[1:]]
            out.append("")
            continue
        out.append(lines[i])
        i += 1
    return out


def grouped_blocks(lines: list[str]) -> list[str]:
    """Group titles become definition-list terms; hanging-indent continuations join their entry's indent."""
    out: list[str] = []
    in_literal_block = False
    literal_indent = 0
    for i, line in enumerate(lines):
        if in_literal_block:
            if line.strip() and indent_of(line) <= literal_indent:
                in_literal_block = False
            else:
                out.append(line)
                continue
        stripped = line.strip()
        nxt = next((n for n in lines[i + 1:] if n.strip()), "")
        prev = out[-1] if out else ""
        is_title = (stripped.endswith(":") and not stripped.endswith("::") and not stripped.startswith((":", ".."))
                    and nxt and indent_of(nxt) > indent_of(line) and i + 1 < len(lines) and lines[i + 1].strip())
        if is_title and prev.strip() and indent_of(prev) == indent_of(line):
            out.append("")                                  # a definition-list term starts after a blank line
        elif (
            stripped
            and prev.strip()
            and indent_of(line) > indent_of(prev) > 0
            and not prev.rstrip().endswith(":")
            and not LIST_ITEM.match(prev)
            and not prev.strip().startswith((":", ".."))
            and not LIST_ITEM.match(line)
        ):
            line = " " * indent_of(prev) + stripped         # a hanging-indent continuation of the entry above
        out.append(line)
        if stripped.endswith("::") or stripped.startswith(".. code-block") or stripped.startswith(".. code::"):
            in_literal_block, literal_indent = True, indent_of(line)
    return out


def unglue_literals(line: str) -> str:
    """Put an escaped space between a literal and a letter glued to it (a plural "s"): docutils ends a literal
    only before a space or punctuation."""
    def fix(match: re.Match) -> str:
        glued = match.group(1)
        return match.group(0)[:len(match.group(0)) - len(glued)] + ("\\ " + glued if glued else "")
    return LITERAL.sub(fix, line)


def inline_fixes(lines: list[str]) -> list[str]:
    """Escape text glued to a closing literal and vertical bars meant as text (outside literal blocks)."""
    out = []
    in_literal_block, literal_indent = False, 0
    for line in lines:
        if in_literal_block and line.strip() and indent_of(line) <= literal_indent:
            in_literal_block = False
        if not in_literal_block and not line.lstrip().startswith("* -") and not line.lstrip().startswith("- "):
            line = TEXT_BARS.sub(r"\\|\1\\|", unglue_literals(line))
        elif not in_literal_block:
            line = unglue_literals(line)
        out.append(line)
        if line.rstrip().endswith("::"):
            in_literal_block, literal_indent = True, indent_of(line)
    return out


def to_rst(lines: list[str]) -> list[str]:
    """The docstring's lines, adapted (see the module docstring)."""
    return inline_fixes(grouped_blocks(markdown_tables(lines)))
