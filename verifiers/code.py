"""The sandbox's short import path: ``from verifiers.code import run_tests``.

Everything lives in :mod:`verifiers.sandbox`; this module re-exports its public names so the
import path that users and the design name keeps working. New code imports
:mod:`verifiers.sandbox`.
"""
from __future__ import annotations

from verifiers.sandbox import *  # noqa: F403
from verifiers.sandbox import __all__  # noqa: F401
