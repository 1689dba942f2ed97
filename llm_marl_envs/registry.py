"""Environment registry: ``register``, ``make``, ``list_envs``, ``spec``.

Entry points are ``"package.module:ClassName"`` strings (imported on first ``make``) or
callables. ``make`` checks keyword arguments against what the entry point accepts, so a typo
is a ``TypeError`` that lists the accepted names instead of a silent default. An env class
declares only its own arguments and passes ``**kwargs`` to its base class; the accepted names
are therefore collected along the class's MRO until an ``__init__`` without ``**kwargs``.

Ids end in a version, ``name-vN`` (the Gymnasium and PettingZoo convention): a change that can
change learning (data, rewards, prompts) registers ``name-v(N+1)`` and keeps ``name-vN`` as it was.
Making an id whose env has a newer version registered warns (``DeprecationWarning``) and names it.

A registration may carry an :class:`EnvSummary` (default agents and turns, data source, verifier):
what ``llm-marl envs`` prints, known without importing the env's module or loading its data.

Envs of other packages, as in Gymnasium: an id ``"my_pkg.my_module:MyEnv-v0"`` imports
``my_pkg.my_module`` (which registers ``MyEnv-v0`` on import) and then makes ``MyEnv-v0``; ``make``,
``spec`` and every command that takes an env id accept it. A package can also register its envs
for every program through the entry-point group :data:`ENTRY_POINT_GROUP` (``llm_marl_envs.envs``):
each entry point names a module to import or a function to call, loaded the first time an id is
not found and before ``list_envs`` answers::

    [project.entry-points."llm_marl_envs.envs"]
    my_pkg = "my_pkg.envs"                # or "my_pkg.envs:register_envs"
"""
from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .core import TextEnv


def accepted_parameters(target: Callable[..., Any]) -> tuple[dict[str, inspect.Parameter], bool]:
    """Keyword parameters ``target`` accepts, and whether it also takes any other keyword.

    For a class, each ``__init__`` along the MRO adds its named parameters (the most derived
    declaration of a name wins, so a subclass may change a default) for as long as the previous
    one forwards ``**kwargs``. A function contributes its own named parameters; one with
    ``**kwargs`` takes any keyword.
    """
    initialisers = ([vars(k)["__init__"] for k in target.__mro__ if "__init__" in vars(k)]
                    if inspect.isclass(target) else [target])
    params: dict[str, inspect.Parameter] = {}
    for init in initialisers:
        signature = inspect.signature(init)
        for name, p in signature.parameters.items():
            if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
                params.setdefault(name, p)
        if not any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
            return params, False
    return params, not inspect.isclass(target)


@dataclass(frozen=True)
class EnvSummary:
    """One row of the env table: default agents and turns, where tasks come from, what scores answers."""

    num_agents: int
    num_turns: int
    data_source: str
    verifier_name: str


@dataclass(frozen=True)
class EnvSpec:
    """A registered environment: its id, how to build it, defaults for ``make`` and its table row."""

    env_id: str
    entry_point: str | Callable[..., TextEnv]
    defaults: dict[str, Any] = field(default_factory=dict)
    summary: EnvSummary | None = None

    def describe(self) -> EnvSummary:
        """The registered :class:`EnvSummary`, else one read from the entry point (imports it)."""
        if self.summary is not None:
            return self.summary
        env_cls = self.load()
        return EnvSummary(int(self.default("num_agents")), int(self.default("num_turns")),
                          getattr(env_cls, "data_source", ""), getattr(env_cls, "verifier_name", ""))

    def load(self) -> Callable[..., TextEnv]:
        """Import and return the entry point."""
        if callable(self.entry_point):
            return self.entry_point
        module_name, _, attr = self.entry_point.partition(":")
        return getattr(importlib.import_module(module_name), attr)

    def parameters(self) -> dict[str, inspect.Parameter]:
        """Keyword parameters the entry point accepts (its own and those its ``**kwargs`` reach)."""
        return accepted_parameters(self.load())[0]

    def default(self, name: str) -> Any:
        """The value ``make`` uses for ``name`` when not overridden."""
        if name in self.defaults:
            return self.defaults[name]
        return self.parameters()[name].default


_REGISTRY: dict[str, EnvSpec] = {}
ENTRY_POINT_GROUP = "llm_marl_envs.envs"
_loaded_entry_points: set[str] = set()


def register(env_id: str, entry_point: str | Callable[..., TextEnv], *, summary: EnvSummary | None = None,
             **defaults: Any) -> None:
    """Register ``env_id``; ``defaults`` are keyword arguments ``make`` passes unless overridden; ``summary``: its
    row of the env table (it must agree with the env's defaults and its ``data_source``/``verifier_name``)."""
    if env_id in _REGISTRY:
        raise ValueError(f"environment id {env_id!r} is already registered")
    if isinstance(entry_point, str) and ":" not in entry_point:
        raise ValueError(f"entry_point must look like 'package.module:ClassName', got {entry_point!r}")
    _REGISTRY[env_id] = EnvSpec(env_id, entry_point, dict(defaults), summary)


def spec(env_id: str) -> EnvSpec:
    """The :class:`EnvSpec` of ``env_id`` (``"module:EnvId-vN"`` imports the module first).

    Unknown ids raise ``ValueError`` listing the registered ones.
    """
    module_name, _, short_id = env_id.rpartition(":")
    if module_name:
        _import_env_module(module_name, env_id)
        if short_id not in _REGISTRY:
            own = sorted(i for i, s in _REGISTRY.items() if _module_of(s.entry_point) == module_name)
            raise ValueError(f"module {module_name!r} registers no environment {short_id!r} (its ids: {own}); "
                             f"call llm_marl_envs.register({short_id!r}, ...) in it")
    elif env_id not in _REGISTRY:
        load_entry_points()
    try:
        return _REGISTRY[short_id]
    except KeyError:
        raise ValueError(f"unknown environment id {env_id!r}; registered ids: {list_envs()}; an env of your own "
                         f"module: 'my_module:MyEnv-v0' imports my_module, which registers MyEnv-v0") from None


def _module_of(entry_point: str | Callable[..., TextEnv]) -> str | None:
    """The module an entry point lives in."""
    return entry_point.partition(":")[0] if isinstance(entry_point, str) else getattr(entry_point, "__module__", None)


def _import_env_module(module_name: str, env_id: str) -> None:
    """Import the module an env id names; a missing or broken module is a ``ValueError`` naming it."""
    try:
        importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is None or not (module_name == err.name or module_name.startswith(f"{err.name}.")):
            raise                   # the module was found but imports something missing: its own error
        raise ValueError(f"environment id {env_id!r} names the module {module_name!r}, which cannot be imported "
                         f"({err}); put its folder on PYTHONPATH or install its package") from None


def load_entry_points() -> None:
    """Load each not yet loaded entry point of :data:`ENTRY_POINT_GROUP`: import its module or call its function.

    A plugin that fails to load warns and is skipped, so one broken package does not hide the others.
    """
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        key = f"{entry_point.name}={entry_point.value}"
        if key in _loaded_entry_points:
            continue
        _loaded_entry_points.add(key)
        try:
            loaded = entry_point.load()
            if callable(loaded):
                loaded()
        except Exception as err:  # a third-party plugin may fail in any way
            warnings.warn(f"the {ENTRY_POINT_GROUP} entry point {key!r} failed to load: {type(err).__name__}: {err}",
                          RuntimeWarning, stacklevel=2)


def make(env_id: str, **overrides: Any) -> TextEnv:
    """Build the registered environment ``env_id`` with its defaults updated by ``overrides``."""
    env_spec = spec(env_id)
    module_prefix = env_id[:len(env_id) - len(env_spec.env_id)]       # "my_module:" of "my_module:MyEnv-v0"
    entry_point = env_spec.load()
    accepted, takes_any = accepted_parameters(entry_point)
    unknown = [] if takes_any else sorted(set(overrides) - set(accepted))
    if unknown:
        raise TypeError(f"{env_id} got unknown keyword argument(s) {unknown}; accepted: {sorted(accepted)}")
    newer = newest_version(env_spec.env_id)
    if newer != env_spec.env_id:
        warnings.warn(f"{env_id} is out of date: use {module_prefix}{newer} (the env module's version history says "
                      "what changed)", DeprecationWarning, stacklevel=2)
    env = entry_point(**{**env_spec.defaults, **overrides})
    env.env_id = env_id
    return env


def newest_version(env_id: str) -> str:
    """The registered id of the newest version of ``env_id``'s env (``env_id`` itself when it is the newest)."""
    name, version = _name_and_version(env_id)
    newest = (version, env_id)
    for other in _REGISTRY:
        other_name, other_version = _name_and_version(other)
        if version is not None and other_name == name and other_version is not None and other_version > newest[0]:
            newest = (other_version, other)
    return newest[1]


def _name_and_version(env_id: str) -> tuple[str, int | None]:
    match = re.fullmatch(r"(.+)-v(\d+)", env_id)
    return (match[1], int(match[2])) if match else (env_id, None)


def list_envs() -> list[str]:
    """All registered environment ids (those of :data:`ENTRY_POINT_GROUP` plugins included), sorted."""
    load_entry_points()
    return sorted(_REGISTRY)
