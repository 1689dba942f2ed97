"""Sphinx configuration: MyST Markdown pages, autodoc for the API reference, the furo theme.

Build from the repository root (the ``docs`` extra installs the tools)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

The environment pages under ``environments/list/`` are generated from the env modules' docstrings
by ``_scripts/gen_env_pages.py``, and ``config_fields.md`` from the config dataclasses by
``_scripts/gen_config_fields.py``, at the start of every build; git ignores them.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))          # document this checkout, not another installed copy
sys.path.insert(0, str(DOCS / "_scripts"))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import docstring_rst  # noqa: E402
import gen_config_fields  # noqa: E402
import gen_env_pages  # noqa: E402

project = "llm-marl-envs"
author = "llm-marl-envs contributors"
copyright = "llm-marl-envs contributors; Apache-2.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_scripts", "results/*/**"]
myst_enable_extensions = ["colon_fence", "dollarmath", "deflist"]
myst_heading_anchors = 3

# ignore-module-all: a package documents what it defines; what it re-exports is documented where it is defined
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True, "ignore-module-all": True}
napoleon_use_ivar = True          # "Attributes:" sections become fields of the class, not second attribute entries
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_mock_imports: list[str] = []

html_theme = "furo"
html_title = "llm-marl-envs"
html_static_path = ["_static"]
html_css_files = ["custom.css"]


def adapt_docstring(app, what, name, obj, options, lines):
    """Env modules' docstrings are Markdown pages of their own (the environment pages); the rest is adapted to reST."""
    if what == "module" and gen_env_pages.is_markdown_docstring(name):
        lines[:] = ["Documented on the environment pages (generated from this module's docstring)."]
        return
    lines[:] = docstring_rst.to_rst(lines)


def setup(app):
    gen_env_pages.write_pages(DOCS / "environments" / "list")
    gen_config_fields.write_page(DOCS / "config_fields.md")
    app.connect("autodoc-process-docstring", adapt_docstring)
