"""SAE Lens' registry of pretrained SAEs (``pretrained_saes.yaml``), read without SAE Lens.

Why read the file ourselves: importing SAE Lens takes about 20 s, and everything a name can
get wrong (an unknown release or id, a transcoder, an SAE for another model) is known from
the registry alone, so it is refused before any import or download. The registry is the one
installed with SAE Lens, so ids, paths and Neuronpedia ids are exactly the ones its loaders
use.
"""

from __future__ import annotations

import functools
import importlib.util
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import (
    SourceError,
    SourceModelMismatch,
    SourceNotFound,
    SourceUnavailable,
    SourceUnsupported,
    suggest,
)
from ..runtime import hub
from ..runtime.paths import cache_dir

REGISTRY_FILE = "pretrained_saes.yaml"
# SAE Lens loaders whose results are not one-hook SAEs (they read one hook and write another,
# or carry state across positions), so steering at one hook does not fit them.
UNSUPPORTED_CONVERSIONS = {
    "gemma_2_transcoder": "transcoders read one hook and write another",
    "mwhanna_transcoder": "transcoders read one hook and write another",
    "mntss_clt_layer_transcoder": "cross-layer transcoders read one hook and write others",
    "temporal": "temporal SAEs encode with state carried across positions",
}
TRANSCODER_WORDS = ("transcoder", "clt")
# Loaders whose SAEs read and write one hook (None: SAE Lens' own format). Tested by name
# against a hub cache: None (gpt2-small-res-jb, pythia-70m-deduped-res-sm), gemma_2, gemma_3,
# llama_scope, qwen_scope.
CONVERSIONS = frozenset(
    {"gemma_2", "gemma_3", "llama_scope", "llama_scope_r1_distill", "qwen_scope",
     "connor_rob_hook_z", "dictionary_learning_1", "deepseek_r1", "sparsify", "goodfire"}
)  # fmt: skip


@dataclass(frozen=True)
class ReleaseInfo:
    """One release of the registry: its repo, model, loader and SAEs by id."""

    name: str
    repo_id: str
    model: str
    conversion_func: str | None
    saes: Mapping[str, Mapping]
    config_overrides: Mapping

    def sae(self, sae_id: str) -> Mapping:
        entry = self.saes.get(sae_id)
        if entry is None:
            near = suggest(sae_id, list(self.saes))
            raise SourceNotFound(
                f"{self.name}/{sae_id}",
                f"release {self.name!r} has no SAE id {sae_id!r}{near} "
                f"({len(self.saes)} ids, e.g. {', '.join(list(self.saes)[:3])})",
            )
        return entry

    def neuronpedia_id(self, sae_id: str) -> str | None:
        return self.sae(sae_id).get("neuronpedia")


def registry_path() -> Path:
    spec = importlib.util.find_spec("sae_lens")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("SAE Lens releases need the sae-lens package")
    return Path(spec.submodule_search_locations[0]) / REGISTRY_FILE


@functools.lru_cache(maxsize=1)
def registry() -> dict[str, ReleaseInfo]:
    """Every release of the installed SAE Lens, by name (about 0.5 s with libyaml)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    raw = yaml.load(registry_path().read_text(encoding="utf-8"), Loader=loader)
    return {
        name: ReleaseInfo(
            name=name,
            repo_id=entry["repo_id"],
            model=entry["model"],
            conversion_func=entry.get("conversion_func"),
            saes={s["id"]: s for s in entry.get("saes", ())},
            config_overrides=entry.get("config_overrides") or {},
        )
        for name, entry in raw.items()
    }


def release_info(release: str, source: str | None = None) -> ReleaseInfo:
    """The registry entry of ``release``; ``SourceNotFound`` with the nearest names if none."""
    releases = registry()
    info = releases.get(release)
    if info is None:
        raise SourceNotFound(
            source or release,
            f"{release!r} is not an SAE Lens release{suggest(release, list(releases))} "
            f"(installed SAE Lens lists {len(releases)}: {registry_path()})",
        )
    return info


def split_location(location: str, source: str | None = None) -> tuple[str, str]:
    """``release/sae_id`` -> (release, sae_id); release names have no slash, ids may."""
    if "/" not in location:
        raise SourceError(
            source or location,
            f"{location!r} is neither a folder nor an SAE Lens 'release/sae_id'",
        )
    release, sae_id = location.split("/", 1)
    return release, sae_id


def check_supported(info: ReleaseInfo, sae_id: str, source: str) -> None:
    """Refuse transcoders and loaders whose SAEs do not read and write one hook."""
    entry = info.sae(sae_id)
    why = UNSUPPORTED_CONVERSIONS.get(info.conversion_func or "")
    path = str(entry.get("path", ""))
    if why is None and any(w in f"{info.name}/{path}".lower() for w in TRANSCODER_WORDS):
        why = "transcoders read one hook and write another"
    if why:
        raise SourceUnsupported(
            source,
            f"release {info.name!r} (conversion_func {info.conversion_func!r}): {why}, which "
            "steering at one hook does not fit",
        )
    if info.conversion_func and info.conversion_func not in CONVERSIONS:
        raise SourceUnsupported(
            source,
            f"release {info.name!r} names conversion_func {info.conversion_func!r}, not one "
            f"whose SAEs we read ({', '.join(sorted(CONVERSIONS))})",
        )


def fetch(location: str, source: str | None, model_id: str | None) -> Path:
    """An SAE Lens ``release/sae_id`` as an SAE Lens folder in our cache
    (``cache_dir()/saes/<release>/<id>``), converted once by SAE Lens' own loader from the
    release repo's files (downloaded into the hub cache, or read from it offline).

    Everything the registry can refuse is refused first, before SAE Lens is imported:
    an unknown release or id (nearest ids suggested), a transcoder or a loader we do not
    read, an SAE for another model than ``model_id`` (the loaded model's hub id).
    """
    name = source or location
    release, sae_id = split_location(location, name)
    info = release_info(release, name)
    info.sae(sae_id)
    check_supported(info, sae_id, name)
    if model_id is not None:
        from ..runtime.model import same_model

        if not same_model(info.model, model_id):
            raise SourceModelMismatch(
                name,
                f"release {release!r} was trained on {info.model!r}, but the loaded model is "
                f"{model_id!r}: load {info.model!r} (sw.Engine({info.model!r}, saes=...))",
            )
    folder = cache_dir() / "saes" / release / sae_id.replace("/", "__")
    if (folder / "cfg.json").is_file():
        return folder
    _convert(info, sae_id, folder, name)
    return folder


def _convert(info: ReleaseInfo, sae_id: str, folder: Path, name: str) -> None:
    """Load with SAE Lens and save its folder (written aside, then renamed: a failed save
    leaves nothing that looks loaded)."""
    import shutil

    try:
        from sae_lens import SAE as LensSAE
    except ImportError as err:  # pragma: no cover - sae-lens is a dependency
        raise SourceError(name, "SAE Lens releases need the sae-lens package") from err
    try:
        with cached_shape_probe(), warnings.catch_warnings():
            # its advice to load the model with these kwargs: we apply them at the hook
            warnings.filterwarnings("ignore", r"\s*This SAE has non-empty model_from_pretrained")
            sae = LensSAE.from_pretrained(info.name, sae_id, device="cpu")
    except Exception as err:  # noqa: BLE001 - the hub's errors, named below
        raise _source_error(info, sae_id, name, err) from err
    sae = sae[0] if isinstance(sae, tuple) else sae
    for param in sae.parameters():  # Llama Scope's loader leaves W_enc, W_dec transposed
        param.data = param.data.contiguous()  # views, which safetensors refuses to save
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    sae.save_model(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def _source_error(info: ReleaseInfo, sae_id: str, name: str, err: Exception) -> SourceError:
    why = hub.cause(err)
    repo = info.repo_id
    if why == hub.GATED:
        return SourceUnavailable(name, hub.gated_note(repo))
    if why == hub.OFFLINE:
        return SourceUnavailable(name, f"release repo {repo!r}: {hub.offline_note()}")
    if why == hub.MISSING:
        return SourceNotFound(name, f"release repo {repo!r} lacks {sae_id!r}'s files: {err}")
    return SourceError(name, f"SAE Lens could not load {info.name}/{sae_id}: {err}")


@contextmanager
def cached_shape_probe() -> Iterator[None]:
    """SAE Lens' Gemma Scope 2 loader reads tensor shapes with HTTP range requests, which
    fail offline even when the file is in the hub cache. It downloads the whole file next
    anyway, so read the shapes from the (cached or downloaded) file's header instead."""
    from sae_lens.loading import pretrained_sae_loaders as loaders

    original = loaders.get_safetensors_tensor_shapes
    loaders.get_safetensors_tensor_shapes = _shapes_from_file
    try:
        yield
    finally:
        loaders.get_safetensors_tensor_shapes = original


def _shapes_from_file(repo_id: str, filename: str) -> dict[str, list[int]]:
    from huggingface_hub import hf_hub_download
    from safetensors import safe_open

    with safe_open(hf_hub_download(repo_id, filename), framework="pt") as f:
        return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
