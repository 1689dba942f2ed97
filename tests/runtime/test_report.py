"""report.html: escaped transcripts, filter facts, and the page as a real browser renders it (headless Chromium)."""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from llm_marl.benchmark import summarize
from llm_marl.report import RunView, episode_facts, write_html_report

INJECTION = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"


def record(episode: int, correct, answers, responses=None) -> dict:
    """An episode record as the benchmark writes it (2 agents unless the lists say otherwise)."""
    return {"episode": episode, "task_index": 10 + episode, "task_id": f"t{episode}", "seed": episode,
            "models": ["m"] * len(correct[0]), "question": f"What is {episode} + 2?", "gold": str(episode + 2),
            "correct": correct, "scores": [[float(c) for c in turn] for turn in correct],
            "rewards": [[float(c) for c in turn] for turn in correct], "answers": answers,
            "responses": responses or [[f"turn {t} agent {i} says {a}" for i, a in enumerate(turn)]
                                       for t, turn in enumerate(answers)],
            "tokens": 10, "wall_time_s": 0.5}


def debate_records() -> list[dict]:
    return [
        # agent 0 right then wrong (C→I), the agents disagree at turn 0
        record(0, [[True, False], [False, False]], [["2", "7"], ["7", "7"]],
               responses=[[INJECTION + " so \\boxed{2}", "\\boxed{7}"], ["\\boxed{7}", "\\boxed{7}"]]),
        # both wrong, then both right (I→C), disagree at turn 0
        record(1, [[False, False], [True, True]], [["4", "5"], ["3", "3"]]),
        # always right, always agreeing
        record(2, [[True, True], [True, True]], [["4", "4"], ["4", "4"]]),
    ]


def single_records() -> list[dict]:
    return [record(i, [[i == 2]], [[str(i + 2 if i == 2 else 9)]]) for i in range(3)]


def views() -> list[RunView]:
    return [RunView("single", summarize(single_records(), 1), single_records()),
            RunView("debate", summarize(debate_records(), 2), debate_records())]


def test_episode_facts_name_transitions_disagreement_and_team_outcome():
    facts = [episode_facts(r) for r in debate_records()]
    assert [(f["C-I"], f["I-C"], f["disagree"], f["outcome"]) for f in facts] == [
        (True, False, True, "incorrect"), (False, True, True, "correct"), (False, False, False, "correct")]
    assert facts[1]["team_answer"] == "3"


def test_page_escapes_model_text_and_needs_no_network(tmp_path):
    path = write_html_report(tmp_path / "report.html", "t <b>itle</b>", views())
    page = path.read_text(encoding="utf-8")
    assert "<script>document.title" not in page and "onerror=\"document" not in page
    assert "&lt;script&gt;document.title=&#x27;pwned&#x27;&lt;/script&gt;" in page
    assert "<title>t &lt;b&gt;itle&lt;/b&gt;</title>" in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)       # nothing fetched: no CDN, no remote image
    assert "<link" not in page and page.count("<svg") >= 2               # plots are inline
    assert 'href="#run=debate&amp;transition=C-I"' in page               # a plot mark links to its episodes


# ------------------------------------------------------------------ in a real browser
def browser() -> str | None:
    return next((path for name in ("chromium", "chromium-browser", "google-chrome")
                 if (path := shutil.which(name))), None)


def rendered(page: Path, fragment: str = "") -> str:
    """The DOM of ``page`` after its scripts ran in headless Chromium (``fragment``: a filter preset)."""
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [browser(), "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={profile}",
             "--virtual-time-budget=5000", "--dump-dom", page.resolve().as_uri() + fragment],
            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def visible_episodes(dom: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r'<article class="episode" id="([^"]+)"([^>]*)>', dom)
            if "hidden" not in m.group(2)]


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    if browser() is None:
        pytest.skip("no headless browser: install Debian's chromium (`apt-get install chromium`; .ci/run does)")
    return write_html_report(tmp_path_factory.mktemp("html") / "report.html", "browser test", views())


def test_browser_renders_transcripts_with_model_text_as_text(page):
    dom = rendered(page)
    assert "<title>browser test</title>" in dom                           # the injected script never ran
    assert "pwned" not in re.search(r"<title>.*?</title>", dom).group(0)
    assert "&lt;script&gt;document.title='pwned'&lt;/script&gt;" in dom  # shown as text in the transcript
    assert "turn 1 agent 0 says 3" in dom and "What is 1 + 2?" in dom
    assert len(visible_episodes(dom)) == 6 and "6 of 6 episodes shown" in dom


@pytest.mark.parametrize("fragment, shown", [
    ("#transition=C-I", ["ep-debate-0"]),
    ("#transition=I-C", ["ep-debate-1"]),
    ("#run=debate&disagree=1", ["ep-debate-0", "ep-debate-1"]),
    ("#run=debate&disagree=0", ["ep-debate-2"]),
    ("#run=single&outcome=correct", ["ep-single-2"]),
])
def test_browser_filters_show_only_matching_episodes(page, fragment, shown):
    dom = rendered(page, fragment)
    assert visible_episodes(dom) == shown
    assert f"{len(shown)} of 6 episodes shown" in dom
