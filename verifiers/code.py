"""The sandbox's short import path: ``from verifiers.code import run_tests``.

Everything lives in :mod:`verifiers.sandbox`; this module re-exports its public names so the
import path that users and the design name keeps working. New code imports
:mod:`verifiers.sandbox`.
"""
from __future__ import annotations

from verifiers.sandbox import (
    DEFAULT_TIMEOUT_S,
    Sandbox,
    SandboxLimits,
    default_sandbox,
    instrument_test,
    run_tests,
    run_tests_batch,
)

__all__ = ["run_tests", "run_tests_batch", "Sandbox", "SandboxLimits", "instrument_test", "default_sandbox",
           "DEFAULT_TIMEOUT_S"]
