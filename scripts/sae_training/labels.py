"""Phase 6, index: each SAE's ``feature_index.json.gz`` (top tokens, top contexts) that
gives every feature its label."""

from __future__ import annotations

import gzip
import json
import time

import numpy as np
import torch

from .activation_cache import cache_paths
from .common import hook_name, log, sae_name


def build_index(args, model, layer: int, data, heldout_acts: torch.Tensor) -> dict:
    from sae_lens import SAE

    from steer_widgets.sae.feature_index import feature_label, final_norm_weight, logit_lens

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
