"""The SAE layer store: every SAE the engine uses, loaded once, evicted by a byte budget.

Why a byte budget and not a count: SAE sizes differ by 100x (a 4k-wide SAE on a 576-wide model
is 19 MB in float32, a 131k-wide one on a 3584-wide model is 3.7 GB). Steering only needs
decoder rows, which are read lazily and kept hot in a small side table, so moving a strength
slider never touches the disk; only heatmaps and top-k queries need a whole SAE resident.
"""

from __future__ import annotations

import operator
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from os import PathLike
from pathlib import Path

from torch import Tensor

from ..errors import RequestError, SourceError
from ..files import user_path
from ..lru import LRU
from .hook_view import view_for
from .releases import fetch
from .sae import CONFIG_FILE, SAE, SAEConfig, check_weights_header, read_tensors

DEFAULT_BUDGET = 512 * 2**20
PACKAGED = Path(__file__).parents[1] / "data" / "saes"


@dataclass
class StoreStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    resident_bytes: int = 0
    peak_resident_bytes: int = 0
    load_seconds: float = 0.0
    row_hits: int = 0
    row_reads: int = 0


class SAEStore:
    """Thread-safe LRU of loaded SAEs under ``budget_bytes``, keyed by source name.

    ``hook_widths`` maps every hook name of the model to its width, so a source that does not
    fit the model is refused when it is added, not in the middle of a request.
    ``centres_writes``: the model is one where TransformerLens' ``center_writing_weights``
    acts (pre-LayerNorm), so SAEs trained with it read centred values (see ``hook_view``).
    ``model_id``: the loaded model's hub id; an SAE Lens release for another model is refused.
    """

    def __init__(
        self,
        hook_widths: Mapping[str, int],
        budget_bytes: int = DEFAULT_BUDGET,
        centres_writes: bool = False,
        model_id: str | None = None,
    ):
        self.hook_widths = dict(hook_widths)
        self.model_id = model_id
        self.centres_writes = centres_writes
        self._configs: dict[str, SAEConfig] = {}
        self._pins: dict[str, int] = {}  # SAEs in use are never evicted
        self._loaded: LRU[str, SAE] = LRU(
            budget=budget_bytes, weight=lambda sae: sae.nbytes(), pinned=self._in_use
        )
        self._rows: dict[tuple[str, int], Tensor] = {}
        self._lock = threading.RLock()
        self._loading: dict[str, threading.Lock] = {}
        self._stats = StoreStats()

    @property
    def budget_bytes(self) -> int:
        return self._loaded.budget

    @budget_bytes.setter
    def budget_bytes(self, value: int) -> None:
        self._loaded.budget = value

    # -- sources ---------------------------------------------------------------------------
    def add(self, location: str | Path, source: str | None = None) -> str:
        """Register an SAE folder (SAE Lens format) or an SAE Lens ``release/sae_id``.

        Returns the source name users see (``{layer}-{folder name}`` unless given).
        """
        folder = (
            user_path(location, "location") if str(location).startswith("~") else Path(location)
        )
        if not folder.is_dir():
            folder = fetch(str(location), source, self.model_id)
        cfg = SAEConfig.read(source or folder.name, folder)
        return self._register(replace(cfg, source=source or _default_name(folder, cfg.layer)))

    def add_packaged(self, model_name: str) -> list[str]:
        """Register the SAEs shipped inside the package for ``model_name``."""
        names = []
        for cfg_path in sorted(PACKAGED.glob(f"*/{CONFIG_FILE}"), key=_layer_key):
            cfg = SAEConfig.read(cfg_path.parent.name, cfg_path.parent)
            if cfg.model_name == model_name:
                names.append(self._register(cfg))
        return names

    def _register(self, cfg: SAEConfig) -> str:
        """Check that ``cfg`` fits the model, give it its view of its hook, and keep it."""
        width = self.hook_widths.get(cfg.hook_name)
        if width is None:
            raise SourceError(cfg.source, f"the model has no hook {cfg.hook_name!r}")
        view = view_for(
            cfg.source, cfg.hook_name, cfg.d_in, cfg.hook_head_index, cfg.model_kwargs,
            width, self.centres_writes,
        )  # fmt: skip
        cfg = replace(cfg, view=view)
        check_weights_header(cfg)
        with self._lock:
            self._configs[cfg.source] = cfg
        return cfg.source

    def sources(self) -> list[str]:
        with self._lock:
            return list(self._configs)

    def config(self, source: str) -> SAEConfig:
        if not isinstance(source, str):
            raise RequestError("source", f"must be an SAE source name, got {source!r}")
        with self._lock:
            cfg = self._configs.get(source)
        if cfg is None:
            known = ", ".join(self.sources()) or "none"
            raise SourceError(source, f"unknown source (known: {known})")
        return cfg

    def check_index(self, source: str, index: int) -> SAEConfig:
        """The source's config, if ``index`` names one of its features (the one range check)."""
        cfg = self.config(source)
        try:
            whole = None if isinstance(index, bool) else operator.index(index)  # numpy ints too
        except TypeError:
            whole = None
        if whole is None or not 0 <= whole < cfg.d_sae:
            raise SourceError(source, f"feature index {index!r} out of range 0..{cfg.d_sae - 1}")
        return cfg

    # -- steering: decoder rows only -------------------------------------------------------
    def direction(self, source: str, index: int) -> Tensor:
        """Feature ``index``'s steering direction at its hook: the decoder row, placed in its
        head's slice for an SAE with ``hook_head_index``."""
        cfg = self.config(source)
        return cfg.view.to_hook(self.decoder_row(source, index), self.hook_widths[cfg.hook_name])

    def decoder_row(self, source: str, index: int) -> Tensor:
        """``W_dec[index]`` as float32, read lazily once and then kept hot."""
        cfg = self.check_index(source, index)
        index = operator.index(index)  # one cache key for 3, np.int64(3), tensor(3)
        key = (source, index)
        with self._lock:
            row = self._rows.get(key)
            if row is not None:
                self._stats.row_hits += 1
                return row
            sae = self._loaded.get(source, touch=False)
        if sae is not None:
            row = sae.W_dec[index].clone()
        else:
            row = read_tensors(cfg, ["W_dec"], rows=slice(index, index + 1))["W_dec"][0]
        with self._lock:
            self._rows[key] = row
            self._stats.row_reads += 1
        return row

    # -- whole SAEs ------------------------------------------------------------------------
    def get(self, source: str) -> SAE:
        """The loaded SAE (loading it on a miss). Prefer ``using`` while computing with it."""
        cfg = self.config(source)
        with self._lock:
            sae = self._loaded.get(source)
            if sae is not None:
                self._stats.hits += 1
                return sae
            gate = self._loading.setdefault(source, threading.Lock())
        with gate:  # two callers asking for the same SAE load it once
            with self._lock:
                sae = self._loaded.get(source, touch=False)
                if sae is not None:
                    self._stats.hits += 1
                    return sae
            start = time.perf_counter()
            sae = SAE(cfg)
            with self._lock:
                self._stats.misses += 1
                self._stats.load_seconds += time.perf_counter() - start
                self._note_evictions(self._loaded.put(source, sae))
            return sae

    @contextmanager
    def using(self, *sources: str) -> Iterator[list[SAE]]:
        """Pin SAEs while a request computes with them, so they are not evicted meanwhile."""
        with self._lock:
            for s in sources:
                self._pins[s] = self._pins.get(s, 0) + 1
        try:
            yield [self.get(s) for s in sources]
        finally:
            with self._lock:
                for s in sources:
                    self._pins[s] -= 1
                self._note_evictions(self._loaded.evict())

    def _in_use(self, source: str) -> bool:
        return self._pins.get(source, 0) > 0

    def _note_evictions(self, evicted: list[str]) -> None:
        """Count what ``self._loaded`` just evicted; warn if the SAEs in use overfill it."""
        self._stats.evictions += len(evicted)
        total = self._loaded.total()
        if total > self.budget_bytes:
            warnings.warn(
                f"SAE store holds {total / 2**20:.0f} MiB, over its budget of "
                f"{self.budget_bytes / 2**20:.0f} MiB, because the SAEs in use need it",
                stacklevel=3,
            )
        self._stats.resident_bytes = total
        self._stats.peak_resident_bytes = max(self._stats.peak_resident_bytes, total)

    def resident(self) -> list[str]:
        with self._lock:
            return list(self._loaded)

    def stats(self) -> dict:
        """Hits, misses, evictions, resident bytes, load time (for the status line too)."""
        with self._lock:
            out = dict(vars(self._stats))
            out["resident"] = list(self._loaded)
            out["budget_bytes"] = self.budget_bytes
            return out

    def clear(self) -> None:
        with self._lock:
            self._loaded.clear()
            self._rows.clear()
            self._stats.resident_bytes = 0


def check_locations(saes) -> None:
    """``Engine(saes=...)``: None, SAE locations (folders or ``release/sae_id``), or a
    mapping from source name to location."""
    if saes is None:
        return
    if isinstance(saes, Mapping):
        items = [(f"saes[{name!r}]", name, loc) for name, loc in saes.items()]
    elif isinstance(saes, (list, tuple)):
        items = [(f"saes[{i}]", "", loc) for i, loc in enumerate(saes)]
    else:
        raise RequestError("saes", f"must be a list of SAE locations or a dict, got {saes!r}")
    for field, name, location in items:
        if not isinstance(name, str) or not isinstance(location, (str, PathLike)):
            raise RequestError(field, f"must be a folder or 'release/sae_id', got {location!r}")


def _default_name(folder: Path, layer: int | None) -> str:
    """``{layer}-{folder name}``, unless the folder name already starts with its layer."""
    if layer is None or folder.name.startswith(f"{layer}-"):
        return folder.name
    return f"{layer}-{folder.name}"


def _layer_key(path: Path) -> tuple:
    head = path.parent.name.split("-")[0]
    return (int(head) if head.isdigit() else 10**9, path.parent.name)
