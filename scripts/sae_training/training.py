"""Phase 3, train: SAE Lens' ``SAETrainer`` per layer over epochs of the cache, with
checkpoints to resume from."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from .activation_cache import EpochProvider, load_cache
from .common import D_MODEL, MODEL_NAME, Timings, hook_name, log


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
