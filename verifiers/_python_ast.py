"""Parsing and compiling Python source one thread at a time.

CPython's AST constructor keeps one recursion counter per interpreter, so two threads that build
ASTs at once can corrupt it and fail with ``SystemError: AST constructor recursion depth mismatch``
(python/cpython#106905). The sandbox instruments tests in a thread pool and batch scoring calls the
coding verifier from threads, so every parse and compile in the verifiers holds :data:`AST_LOCK`.
"""
from __future__ import annotations

import ast
import threading
import warnings
from types import CodeType

AST_LOCK = threading.Lock()
"""Held while Python source is parsed into an AST or an AST or source is compiled."""


def parse(source: str, quiet: bool = False) -> ast.Module:
    """``ast.parse(source)`` under :data:`AST_LOCK`; ``quiet`` drops the Syntax/DeprecationWarnings of model code."""
    with AST_LOCK:
        if not quiet:
            return ast.parse(source)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(source)


def compile_module(source: str | ast.Module, filename: str) -> CodeType:
    """``compile(source, filename, "exec")`` under :data:`AST_LOCK`, without this module's ``__future__`` flags."""
    with AST_LOCK:
        return compile(source, filename, "exec", dont_inherit=True, optimize=0)
