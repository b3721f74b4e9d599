"""The default model's own chat answers over a broad topic list (SAE training data).

SAEs trained only on speeches and the Brown corpus learn few features for what a chat
model talks about when steered; training on its own answers puts the chat template, the
assistant voice and everyday topics in distribution. Each prompt is one topic from
``scripts/chat_topics.txt`` in one of a few question templates; answers are sampled
(temperature 0.8, seeded per batch) in left-padded batches with transformers' ``generate``
on the offline default model, and appended to ``chat_corpus.jsonl`` in a fixed shuffled
order (resumable: finished prompts are skipped on a re-run; a run stopped early still covers
the whole topic list)::

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/generate_chat_corpus.py --work-dir /tmp/sae_cache
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TEMPLATES = (
    "Tell me about {t}.",
    "Write a short paragraph about {t}.",
    "What are some interesting facts about {t}?",
    "Explain {t} to a ten-year-old.",
    "Write a short story that involves {t}.",
    "What do people usually feel or think about {t}?",
)


def prompts(topics_file: Path) -> list[str]:
    topics = [
        line.strip()
        for line in topics_file.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    out = [tpl.format(t=t) for t in topics for tpl in TEMPLATES]
    random.Random(0).shuffle(out)  # a run stopped early still covers every kind of topic
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/sae_cache"))
    p.add_argument("--topics", type=Path, default=REPO / "scripts" / "chat_topics.txt")
    p.add_argument("--max-new", type=int, default=160)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--limit", type=int, default=None, help="stop after this many prompts")
    args = p.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from steer_widgets.runtime.model import default_model_dir

    folder = default_model_dir()
    tok = AutoTokenizer.from_pretrained(folder, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = args.work_dir / "chat_corpus.jsonl"
    args.work_dir.mkdir(parents=True, exist_ok=True)
    done = set()
    if out.exists():
        done = {json.loads(line)["prompt"] for line in out.read_text().splitlines() if line}
    todo = [q for q in prompts(args.topics) if q not in done][: args.limit]
    print(f"{len(done)} done, {len(todo)} to generate", flush=True)
    t0, n_tok = time.time(), 0
    for i in range(0, len(todo), args.batch):
        batch = todo[i : i + args.batch]
        chats = [
            tok.apply_chat_template(
                [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
            )
            for q in batch
        ]
        enc = tok(chats, return_tensors="pt", padding=True, add_special_tokens=False)
        torch.manual_seed(i)
        with torch.no_grad():
            gen = model.generate(
                **enc,
                max_new_tokens=args.max_new,
                do_sample=True,
                temperature=0.8,
                top_p=0.95,
                pad_token_id=tok.pad_token_id or tok.eos_token_id,
            )
        with out.open("a") as f:
            for q, row, mask in zip(batch, gen, enc["attention_mask"], strict=True):
                prompt_ids = row[: mask.shape[0]][mask.bool()].tolist()
                new = row[mask.shape[0] :].tolist()
                if tok.eos_token_id in new:
                    new = new[: new.index(tok.eos_token_id) + 1]
                n_tok += len(new)
                f.write(
                    json.dumps({"prompt": q, "ids": prompt_ids + new, "n_prompt": len(prompt_ids)})
                    + "\n"
                )
        el = time.time() - t0
        print(
            f"{i + len(batch)}/{len(todo)} prompts, {n_tok} new tokens, {n_tok / el:.0f} tok/s",
            flush=True,
        )


if __name__ == "__main__":
    main()
