"""Native backends on every CPU: the AMX decision, the crash probe and its fallback, crash-isolated tests, `info`."""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llm_marl import native_probe
from llm_marl.hardware import EXTRA_BUFFERS_ENV, cpu_info, llamacpp_extra_buffers
from llm_marl.native_probe import PROBE_ENV, probe_llamacpp

# Flags of the machines the project meets (from /proc/cpuinfo): a Sapphire Rapids Xeon, an EPYC, an AVX2-only box.
XEON_AMX = "fpu sse2 avx avx2 fma avx512f avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8".split()
EPYC_AVX512 = "fpu sse2 avx avx2 fma avx512f avx512_bf16 avx512_vnni".split()
AVX2_ONLY = "fpu sse2 avx avx2 fma f16c".split()
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("flags, expected", [(XEON_AMX, False), (EPYC_AVX512, True), (AVX2_ONLY, True), ([], True),
                                             (["AMX_TILE"], False)])
def test_extra_buffers_are_off_exactly_on_amx_cpus(flags, expected):
    choice = llamacpp_extra_buffers(flags, env={})
    assert choice.use_extra_bufts is expected
    assert ("crashes" in choice.reason) is (not expected)


@pytest.mark.parametrize("value, expected", [("on", True), ("1", True), ("off", False), ("0", False), ("auto", None),
                                             ("", None)])
def test_environment_variable_forces_either_choice(value, expected):
    for flags in (XEON_AMX, EPYC_AVX512):
        choice = llamacpp_extra_buffers(flags, env={EXTRA_BUFFERS_ENV: value})
        want = ("amx_tile" not in flags) if expected is None else expected
        assert choice.use_extra_bufts is want
        if expected is not None:
            assert EXTRA_BUFFERS_ENV in choice.reason


def test_bad_environment_value_is_named():
    with pytest.raises(ValueError, match=f"{EXTRA_BUFFERS_ENV} must be one of auto, on, off; got 'sometimes'"):
        llamacpp_extra_buffers(EPYC_AVX512, env={EXTRA_BUFFERS_ENV: "sometimes"})


def test_cpu_info_reads_model_and_flags(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\n"
                       f"flags\t\t: {' '.join(XEON_AMX)}\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    info = cpu_info(str(cpuinfo))
    assert info.model == "Intel(R) Xeon(R) Platinum 8481C"
    assert info.has_amx and "avx512f" in info.relevant_flags and info.flags == frozenset(XEON_AMX)
    assert not cpu_info(str(tmp_path / "missing")).flags        # no /proc/cpuinfo (macOS): no flags, no crash


# ------------------------------------------------------------------------------------------ the probe
@pytest.fixture
def probe_dir(tmp_path, monkeypatch):
    """Probe verdicts cached in a fresh folder, the probe switched on."""
    monkeypatch.setattr(native_probe, "probe_cache_dir", lambda: tmp_path / "probes")
    monkeypatch.delenv(PROBE_ENV, raising=False)
    return tmp_path / "probes"


def crashing_child(counter: Path):
    """A probe command that counts its runs in ``counter`` and then dies of SIGSEGV, as ggml's AMX matmul does."""
    code = (f"import os, signal; f = open({str(counter)!r}, 'a'); f.write('x'); f.close(); "
            "os.kill(os.getpid(), signal.SIGSEGV)")
    return lambda model_path, use_extra_bufts: [sys.executable, "-c", code]


def a_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF not really")
    return path


def test_probe_reports_a_native_crash_and_caches_the_verdict(tmp_path, monkeypatch, probe_dir):
    counter = tmp_path / "runs"
    monkeypatch.setattr(native_probe, "probe_command", crashing_child(counter))
    choice = llamacpp_extra_buffers(XEON_AMX, env={EXTRA_BUFFERS_ENV: "on"})
    first = probe_llamacpp(a_gguf(tmp_path), choice)
    assert not first.ok and "SIGSEGV" in first.cause and not first.cached
    second = probe_llamacpp(a_gguf(tmp_path), choice)
    assert not second.ok and second.cached and second.key == first.key
    assert counter.read_text() == "x"                        # probed once; the second answer came from the cache
    assert len(list(probe_dir.glob("llamacpp-*.json"))) == 1


def test_probe_key_changes_with_the_buffer_choice(tmp_path):
    model = a_gguf(tmp_path)
    on, off = (llamacpp_extra_buffers([], env={EXTRA_BUFFERS_ENV: v}) for v in ("on", "off"))
    assert native_probe.probe_key(model, on) != native_probe.probe_key(model, off)


def test_probe_reports_exit_status_and_last_line(tmp_path, monkeypatch, probe_dir):
    monkeypatch.setattr(native_probe, "probe_command", lambda path, extra: [
        sys.executable, "-c", "import sys; print('loading'); sys.exit('ggml: unsupported quantization')"])
    verdict = probe_llamacpp(a_gguf(tmp_path), llamacpp_extra_buffers([], env={}))
    assert not verdict.ok and "status 1" in verdict.cause and "unsupported quantization" in verdict.cause


def test_probe_can_be_switched_off(tmp_path, monkeypatch, probe_dir):
    counter = tmp_path / "runs"
    monkeypatch.setattr(native_probe, "probe_command", crashing_child(counter))
    monkeypatch.setenv(PROBE_ENV, "off")
    assert probe_llamacpp(a_gguf(tmp_path), llamacpp_extra_buffers([], env={})).ok
    assert not counter.exists()


@pytest.mark.slow
@pytest.mark.ci_slow
def test_crashing_probe_falls_back_to_hf_with_one_warning(tmp_path, monkeypatch, probe_dir, caplog):
    from llm_marl.backends import load_policy
    from llm_marl.backends.hf import HFPolicy
    from llm_marl.policy import SamplingParams

    monkeypatch.setattr(native_probe, "probe_command", crashing_child(tmp_path / "runs"))
    with caplog.at_level(logging.WARNING, logger="llm_marl"):
        policy = load_policy("llamacpp", "smollm2-135m", seed=0, max_batch=4, n_ctx=512)
    assert isinstance(policy, HFPolicy)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    line = warnings[0].getMessage()
    assert "\n" not in line and "SIGSEGV" in line and EXTRA_BUFFERS_ENV in line and PROBE_ENV in line
    out = policy.generate([[{"role": "user", "content": "Say hi."}]], SamplingParams(max_new_tokens=4, temperature=0))
    assert out[0][0].num_tokens > 0                                  # the fallback really generates


@pytest.mark.slow
@pytest.mark.ci_slow
@pytest.mark.parametrize("extra_buffers", [True, False])
def test_real_probe_passes_on_this_machine_with_either_buffer_choice(probe_dir, extra_buffers):
    from llm_marl.models import gguf_path

    choice = llamacpp_extra_buffers([], env={EXTRA_BUFFERS_ENV: "on" if extra_buffers else "off"})
    verdict = probe_llamacpp(gguf_path("smollm2-135m"), choice)
    assert verdict.ok, verdict.cause


# ------------------------------------------------------------------------------------------ isolated crashes
def test_a_native_crash_fails_one_test_and_the_suite_goes_on(tmp_path):
    """Our conftest runs `native`-marked tests in a child: a segfault there is that test's failure only."""
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_a_crash.py").write_text(textwrap.dedent("""
        import ctypes
        import pytest

        def test_before_the_crash():
            assert 1 + 1 == 2

        @pytest.mark.native
        def test_segfaults_in_native_code():   # last of its module: the module is torn down after it
            ctypes.string_at(0)            # reads address 0: SIGSEGV, as a crashing ggml kernel would
    """))
    (tmp_path / "test_b_after.py").write_text("def test_after_the_crash():\n    assert 2 + 2 == 4\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out                          # tests failed; pytest itself did not die
    assert "1 failed, 2 passed" in out, out
    assert "test_segfaults_in_native_code" in out and "crashed" in out.lower(), out


# ------------------------------------------------------------------------------------------ llm-marl info
def test_info_reports_versions_cpu_and_backend_choice():
    done = subprocess.run([sys.executable, "-m", "llm_marl.cli", "info"], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    labels = {line.split(":")[0].strip() for line in out.splitlines()}
    for label in ("python", "torch", "transformers", "llama-cpp-python", "cpu", "cpu features", "threads",
                  "llama.cpp buffers", "llama.cpp probe", "heap", "data dir", "sandbox"):
        assert label in labels, f"{label!r} missing from:\n{out}"
    expected = llamacpp_extra_buffers(cpu_info().flags)
    assert f"use_extra_bufts={expected.use_extra_bufts}" in out
    assert cpu_info().model in out


@pytest.mark.native
def test_load_policy_probes_the_buffer_setting_it_will_run_with(tmp_path, monkeypatch, probe_dir):
    from llm_marl.backends import LlamaCppPolicy, load_policy

    probed = []

    def recording_child(model_path, use_extra_bufts):
        probed.append(use_extra_bufts)
        return [sys.executable, "-c", "pass"]

    monkeypatch.setattr(native_probe, "probe_command", recording_child)
    monkeypatch.setenv(EXTRA_BUFFERS_ENV, "on")
    policy = load_policy("llamacpp", "smollm2-135m", use_extra_bufts=False, max_batch=1, n_ctx=64)
    assert isinstance(policy, LlamaCppPolicy)
    assert probed == [False] and policy.buffers.use_extra_bufts is False       # the caller's setting, not the env's
    policy.close()


def test_info_reports_the_probe_of_the_weights_llamacpp_runs(tmp_path, monkeypatch, probe_dir):
    """`load_policy` probes the embedded model's F16 conversion, so that is the verdict `info` must find."""
    import json

    from llm_marl import info
    from llm_marl.models import CACHE_ENV, converted_gguf_path

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    assert info._probe_line() == "not probed yet on this machine"
    f16 = converted_gguf_path("smollm2-135m", "f16")
    f16.parent.mkdir(parents=True)
    f16.write_bytes(b"GGUF stand-in: only its name and size enter the probe key")
    choice = llamacpp_extra_buffers(cpu_info().flags)
    verdict_file = probe_dir / f"llamacpp-{native_probe.probe_key(f16, choice)}.json"
    probe_dir.mkdir()
    verdict_file.write_text(json.dumps({"ok": True, "cause": ""}))
    assert info._probe_line() == f"ok ({f16.name})"
    verdict_file.write_text(json.dumps({"ok": False, "cause": "killed by SIGSEGV"}))
    assert info._probe_line().startswith(f"FAILED on {f16.name}: killed by SIGSEGV")
