"""Phase 5, eval: held-out FVE, L0, dead features and next-token CE with and without the
SAE spliced in at its hook."""

from __future__ import annotations

import json
import time

import torch

from .common import D_MODEL, hook_name, log, sae_name


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
