"""The documentation's code runs, its generated pages cover every env, and the README stays a front door."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import llm_marl_envs
from llm_marl_envs import registry

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_scripts"))

import docstring_rst  # noqa: E402
import gen_config_fields  # noqa: E402
import gen_env_pages  # noqa: E402


def python_blocks(markdown: str) -> list[str]:
    """The fenced ```python blocks of a Markdown page, in order."""
    return re.findall(r"^```python\n(.*?)^```", markdown, flags=re.S | re.M)


def test_custom_env_walkthrough_runs():
    """The custom-env page's code passes text_env_api_test and held_out_test and plays an episode."""
    blocks = python_blocks((DOCS / "environments" / "custom_env.md").read_text(encoding="utf-8"))
    assert blocks, "docs/environments/custom_env.md has no python block"
    namespace: dict = {"__name__": "custom_env_walkthrough"}
    try:
        for block in blocks:
            exec(compile(block, "docs/environments/custom_env.md", "exec"), namespace)
        assert "reverse_word-v0" in llm_marl_envs.list_envs()
        env = llm_marl_envs.make("reverse_word-v0", num_agents=3, split="test")
        env.reset(seed=1)
        assert env.task["word"] not in {t["word"] for t in namespace["ReverseWordEnv"](split="train").tasks}
    finally:
        registry._REGISTRY.pop("reverse_word-v0", None)


def test_env_pages_cover_every_registered_env(tmp_path):
    """One generated page per registered env, opening with its title and naming its source module."""
    pages = gen_env_pages.write_pages(tmp_path / "list")
    env_pages = {p.stem: p for p in pages if p.parent.name == "list"}
    assert set(env_pages) == set(llm_marl_envs.list_envs())
    for env_id, page in env_pages.items():
        text = page.read_text(encoding="utf-8")
        assert text.startswith("# "), env_id
        assert f"Environment `{env_id}`" in text
        assert "\n## Arguments" in text, f"{env_id}: its docstring has no '### Arguments' section"
    assert {p.stem for p in pages if p.parent.name == "protocols"} == set(gen_env_pages.PROTOCOL_MODULES)


def test_config_fields_page_lists_every_field_with_its_flag_default_and_help(tmp_path):
    """The generated page has one row per field of TrainerConfig, MAGRPOConfig and MAPPOConfig, from the code."""
    import dataclasses

    from trainers.magrpo import MAGRPOConfig
    from trainers.mappo import MAPPOConfig

    text = gen_config_fields.write_page(tmp_path / "config_fields.md").read_text(encoding="utf-8")
    sections = {section.split("\n", 1)[0]: {line.split("|")[1].strip(" `"): line for line in section.splitlines()
                                            if line.startswith("| `")} for section in text.split("\n## ")[1:]}
    shared = sections["Shared by both trainers (`TrainerConfig`)"]
    for config_cls in (MAGRPOConfig, MAPPOConfig):
        own = sections[f"{config_cls.__name__[:-6]} (`{config_cls.__module__}.{config_cls.__name__}`)"]
        for field in dataclasses.fields(config_cls):
            row = {**shared, **own}[field.name]
            assert f"`--{field.name.replace('_', '-')}`" in row
            assert " ".join(field.metadata["help"].split()).replace("|", "\\|") in row, field.name
    assert "MAGRPO: `100`, MAPPO: `10`" in shared["max_steps"] and "| `0.9` |" in shared["top_p"]
    assert "(configs.md)" in text and (DOCS / "configs.md").is_file()


def test_env_page_links_protocols_and_api():
    page = gen_env_pages.as_page("# T\n\nSee `llm_marl_envs.envs.debate` and `verifiers.math.verify_answer`.\n"
                                 "```python\nx = `verifiers.math`\n```", "a.py", "Note.")
    assert "[`llm_marl_envs.envs.debate`](../protocols/debate.md)" in page
    assert "{py:obj}`verifiers.math.verify_answer`" in page
    assert "x = `verifiers.math`" in page, "code blocks are left alone"


def test_docstring_adapter():
    """Markdown tables become list-tables, hanging indents join their entry, glued literals and bars are escaped."""
    lines = ["Intro:", "", "| a | b |", "|---|---|", "| 1 | ``x`` |", "", "Group:",
             "    name: a long entry that", "        continues here.", "", "``DTensor``s and |a ∩ b|."]
    out = docstring_rst.to_rst(lines)
    assert ".. list-table::" in out and "   * - 1" in out and "     - ``x``" in out
    assert "    continues here." in out
    assert out[-1] == "``DTensor``\\ s and \\|a ∩ b\\|."


def test_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    for needed in ('pip install torch==2.13.0 -e ".[test,semantic]" && llm-marl bench arithmetic_debate-v0',
                   'pip install torch==2.13.0 -e ".[test,semantic]" && python -m pytest',
                   "arxiv.org/abs/2502.18439", "arxiv.org/abs/2508.04652", "LICENSE", "CITATION.cff"):
        assert needed in readme, needed
    for target in re.findall(r"\]\(((?:docs|examples|benchmarks)/[^)#]+|[A-Z]+\.(?:md|cff)|LICENSE)\)", readme):
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
