"""Phase 2, cache: the model run once, the residual at each hook stored in float16 memmaps
(resumable), and epochs of batches read back from them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from .common import D_MODEL, Timings, hook_name, log


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
