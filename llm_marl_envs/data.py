"""Dataset loading: a local JSONL directory first, then the Hugging Face hub via ``datasets``.

Each task module declares a :class:`DatasetSpec`. :func:`load_records` looks for
``<data_dir>/<spec.local_dir>/<file>`` in the ``data_dir=`` argument, then in the folder named
by ``LLM_MARL_DATA_DIR``, then calls ``datasets.load_dataset(spec.hub_id, ...)``, then (for a split
that has one) the spec's local stand-in file, with a warning. The hub is asked only when it is
reachable (:mod:`llm_marl_envs.hub`: one quick check per process, no retries); with
``HF_HUB_OFFLINE=1`` or ``HF_DATASETS_OFFLINE=1`` ``load_dataset`` reads only the datasets cache.
When all of them fail it raises :class:`DataNotFoundError` saying where it looked and how to
provide data.
The local layout is the one of the project's offline copies (``shared/data``), e.g.
``gsm8k/test.jsonl`` or ``anli_r3/dev.jsonl``.

Splits are compared by content, not by id: :func:`canonical_text` is what "the same task" means
(lower case, whitespace collapsed), and :func:`hash_split` assigns a text to ``"train"`` or
``"test"`` by a hash of it, so generated tasks land in disjoint splits by construction.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from .hub import DATASETS_OFFLINE_VARIABLES, hub_unreachable, offline_variable

DATA_DIR_ENV = "LLM_MARL_DATA_DIR"

Record = dict[str, Any]


class DataNotFoundError(FileNotFoundError):
    """No source (argument, environment variable or hub) could provide a dataset split."""


@dataclass(frozen=True, eq=False)  # hashed by identity: specs are module constants
class DatasetSpec:
    """Where one dataset lives, locally and on the hub, and how to normalise its rows.

    Attributes:
        name: short name used in messages (``"gsm8k"``).
        local_dir: folder under the data directory (``"gsm8k"``).
        local_files: the env's split name -> JSONL file in ``local_dir``.
        hub_id: ``datasets.load_dataset`` path (``"openai/gsm8k"``), or ``None``.
        hub_config: the hub dataset's config name, if any.
        hub_splits: the env's split name -> the hub's split name.
        normalize: maps a raw row (local or hub shape) and its index to the env's record, which must
            carry a ``task_id``.
        local_filter: optional predicate on normalised local rows (e.g. MBPP's standard split
            by task id, since the local file holds all rows).
        fallback_files: the env's split name -> a JSONL file in ``local_dir`` that stands in for the
            split when neither its local file nor the hub provides it (e.g. ANLI's dev file for
            its train split, which has no offline copy); using one warns.
    """

    name: str
    local_dir: str
    local_files: Mapping[str, str]
    normalize: Callable[[Record, int], Record]
    hub_id: str | None = None
    hub_config: str | None = None
    hub_splits: Mapping[str, str] = field(default_factory=dict)
    local_filter: Callable[[Record, str], bool] | None = None
    fallback_files: Mapping[str, str] = field(default_factory=dict)

    @property
    def splits(self) -> list[str]:
        """Every split that some source can provide."""
        return sorted(set(self.local_files) | set(self.hub_splits) | set(self.fallback_files))


def canonical_text(text: str) -> str:
    """``text`` lower-cased with runs of whitespace collapsed: two tasks are the same when these match."""
    return " ".join(text.lower().split())


def hash_split(text: str, train_fraction: float = 0.5) -> str:
    """``"train"`` or ``"test"``: where ``text`` belongs under a split of the content space by a hash.

    A fixed function of :func:`canonical_text` (SHA-256, independent of Python's hash seed), so a
    task can never be in both splits, whatever generated it; ``train_fraction`` of all texts go to train.
    """
    if not 0 < train_fraction < 1:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    digest = hashlib.sha256(canonical_text(text).encode("utf-8")).digest()
    return "train" if int.from_bytes(digest[:8], "big") < train_fraction * 2**64 else "test"


def read_jsonl(path: str | os.PathLike) -> list[Record]:
    """Read a JSONL file; a malformed line raises ``ValueError`` naming the file and line."""
    rows: list[Record] = []
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({err.msg})") from err
    return rows


def candidate_dirs(data_dir: str | os.PathLike | None) -> list[tuple[str, Path]]:
    """The local data directories to try, in order, each with where it came from."""
    dirs: list[tuple[str, Path]] = []
    if data_dir is not None:
        dirs.append(("data_dir argument", Path(data_dir)))
    env_dir = os.environ.get(DATA_DIR_ENV)
    if env_dir:
        dirs.append((f"${DATA_DIR_ENV}", Path(env_dir)))
    return dirs


def load_records(spec: DatasetSpec, split: str, data_dir: str | os.PathLike | None = None) -> list[Record]:
    """Load one split of ``spec`` as a list of normalised records (see module docstring)."""
    if split not in spec.splits:
        raise ValueError(f"{spec.name} has no split {split!r}; choose one of {spec.splits}")
    looked: list[str] = []
    if split in spec.local_files:
        for origin, folder in candidate_dirs(data_dir):
            path = folder / spec.local_dir / spec.local_files[split]
            if path.is_file():
                return list(_load_local(spec, split, str(path.resolve())))
            looked.append(f"{path} ({origin}): no such file")
    else:
        looked.append(f"no local file for split {split!r} (local splits: {sorted(spec.local_files)})")
    if not candidate_dirs(data_dir):
        looked.append(f"no local directory given (data_dir=None and ${DATA_DIR_ENV} unset)")
    if spec.hub_id is not None and split in spec.hub_splits:
        call = f"datasets.load_dataset({spec.hub_id!r}, {spec.hub_config!r}, split={spec.hub_splits[split]!r})"
        offline = offline_variable(DATASETS_OFFLINE_VARIABLES)
        unreachable = None if offline or Path(spec.hub_id).is_dir() else hub_unreachable()
        if unreachable is not None:
            looked.append(f"{call}: not called, the hub is not reachable ({unreachable}); "
                          "HF_HUB_OFFLINE=1 reads the datasets cache instead")
        else:
            try:
                return _load_hub(spec, split)
            except Exception as err:  # the hub raises many types (connection, offline, missing)
                where = f" ({offline}: the datasets cache only)" if offline else ""
                looked.append(f"{call}{where} failed: {type(err).__name__}: {err}")
    if split in spec.fallback_files:
        for origin, folder in candidate_dirs(data_dir):
            path = folder / spec.local_dir / spec.fallback_files[split]
            if path.is_file():
                warnings.warn(f"{spec.name} split {split!r}: no local file or hub copy, using the stand-in {path}",
                              stacklevel=2)
                return list(_load_local(spec, split, str(path.resolve())))
            looked.append(f"{path} ({origin}, stand-in for split {split!r}): no such file")
    example = f"{spec.local_dir}/{next(iter(spec.local_files.values()), '<split>.jsonl')}"
    raise DataNotFoundError(
        f"No data for {spec.name} split {split!r}. Looked in:\n  - " + "\n  - ".join(looked)
        + f"\nProvide it with data_dir=... or {DATA_DIR_ENV}=... pointing at a folder that holds "
        f"{example} (JSONL, one row a line), or make the hub dataset {spec.hub_id!r} reachable."
    )


@lru_cache(maxsize=32)
def _load_local(spec: DatasetSpec, split: str, path: str) -> tuple[Record, ...]:
    records = [spec.normalize(row, i) for i, row in enumerate(read_jsonl(path))]
    if spec.local_filter is not None:
        records = [r for r in records if spec.local_filter(r, split)]
    if not records:
        raise ValueError(f"{path} holds no rows for {spec.name} split {split!r}")
    return tuple(records)


def _load_hub(spec: DatasetSpec, split: str) -> list[Record]:
    import datasets  # heavy import, only on this path

    rows = datasets.load_dataset(spec.hub_id, spec.hub_config, split=spec.hub_splits[split])
    return [spec.normalize(dict(row), i) for i, row in enumerate(rows)]
