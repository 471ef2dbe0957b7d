"""GMM-free baselines on a built corpus: frame accuracy (and PER) of a small frame classifier.

Not a stage of ``run.sh``: it measures how hard the task is (the README's baseline number). Inputs
are the 40-dim fbank features with per-speaker CMVN (``apply-cmvn --utt2spk``) and, for the MLP,
+-5 frames of context (440 inputs); targets are the pdf-ids of the alignments (119 monophone
states). Reports frame accuracy on pdfs and on phones (pdfs folded to their phone) for dev and test,
and the PER of decoding the test set with ``decode.py`` (log posteriors minus log priors, as a
hybrid system does; acoustic scale picked on dev).

    python -m recipes.mini_timit.local.baseline --model mlp --epochs 5 recipes/mini_timit
    python -m recipes.mini_timit.local.baseline --model gru --epochs 8 recipes/mini_timit
"""

from __future__ import annotations

import argparse
import gzip
import time
from pathlib import Path

import kaldiio
import numpy as np
import torch

from bru_kaldi import decoding as decode
from recipes.mini_timit.local.layout import read_table
from bru_kaldi.scoring import score
from bru_kaldi.kaldi.transition_model import read_transition_model

CONTEXT = 5


def load_split(root: Path, split: str, tid2pdf: np.ndarray):
    """CMVN-normalised fbank (T, 40) and pdf targets (T,) per utterance, sorted by utterance id."""
    data = root / "data" / split
    feats = kaldiio.load_scp(str(data / "feats.scp"))
    cmvn = kaldiio.load_scp(str(data / "cmvn.scp"))
    utt2spk = read_table(data / "utt2spk")
    ali = {}
    ali_dir = root / "exp" / f"mono_ali_{split}"
    for job in range(1, int((ali_dir / "num_jobs").read_text()) + 1):
        with gzip.open(ali_dir / f"ali.{job}.gz") as f:
            ali.update(kaldiio.load_ark(f))
    out = []
    for utt in sorted(utt2spk):
        stats = cmvn[utt2spk[utt]]
        mean = stats[0, :-1] / stats[0, -1]
        std = np.sqrt(np.maximum(stats[1, :-1] / stats[0, -1] - mean ** 2, 1e-10))
        out.append((utt, ((feats[utt] - mean) / std).astype(np.float32), tid2pdf[ali[utt]]))
    return out


def splice(x: np.ndarray) -> np.ndarray:
    """(T, D) -> (T, (2 * CONTEXT + 1) * D), edge frames repeated (Kaldi's splice-feats)."""
    padded = np.concatenate([np.repeat(x[:1], CONTEXT, 0), x, np.repeat(x[-1:], CONTEXT, 0)])
    return np.concatenate([padded[i:i + len(x)] for i in range(2 * CONTEXT + 1)], axis=1)


class GRU(torch.nn.Module):
    """Two bidirectional GRU layers over (B, T, 40) -> (B, T, num_pdfs)."""

    def __init__(self, num_pdfs: int, hidden: int = 256):
        super().__init__()
        self.rnn = torch.nn.GRU(40, hidden, num_layers=2, batch_first=True, bidirectional=True, dropout=0.2)
        self.out = torch.nn.Linear(2 * hidden, num_pdfs)

    def forward(self, x):
        return self.out(self.rnn(x)[0])


def mlp(num_pdfs: int, hidden: int = 512) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(40 * (2 * CONTEXT + 1), hidden), torch.nn.ReLU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(hidden, num_pdfs),
    )


def log_posteriors(model, kind: str, utts) -> list[np.ndarray]:
    model.eval()
    with torch.no_grad():
        if kind == "mlp":
            return [torch.log_softmax(model(torch.from_numpy(splice(x))), -1).numpy() for _, x, _ in utts]
        return [torch.log_softmax(model(torch.from_numpy(x)[None]), -1)[0].numpy() for _, x, _ in utts]


def train(kind: str, train_utts, num_pdfs: int, epochs: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = mlp(num_pdfs) if kind == "mlp" else GRU(num_pdfs)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if kind == "mlp":
        x = torch.from_numpy(np.concatenate([splice(f) for _, f, _ in train_utts]))
        y = torch.from_numpy(np.concatenate([t for _, _, t in train_utts]).astype(np.int64))
    for epoch in range(epochs):
        model.train()
        start, total, steps = time.time(), 0.0, 0
        if kind == "mlp":
            order = torch.from_numpy(rng.permutation(len(x)))
            for i in range(0, len(order), 256):
                b = order[i:i + 256]
                loss = torch.nn.functional.cross_entropy(model(x[b]), y[b])
                opt.zero_grad()
                loss.backward()
                opt.step()
                total, steps = total + loss.item(), steps + 1
        else:
            order = rng.permutation(len(train_utts))
            for i in range(0, len(order), 4):
                batch = [train_utts[j] for j in order[i:i + 4]]
                xs = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(f) for _, f, _ in batch], batch_first=True)
                ys = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(t.astype(np.int64)) for _, _, t in batch],
                                                     batch_first=True, padding_value=-100)  # padded frames carry no loss
                loss = torch.nn.functional.cross_entropy(model(xs).transpose(1, 2), ys, ignore_index=-100)
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
                opt.step()
                total, steps = total + loss.item(), steps + 1
        print(f"epoch {epoch + 1}: loss {total / steps:.3f} ({time.time() - start:.0f} s)", flush=True)
    return model


def per(root: Path, utts, logpost, log_prior, tid2pdf, acwt: float) -> float:
    graph = decode.load_graph(root / "exp" / "mono" / "graph" / "HCLG.fst")
    words = {int(i): w for w, i in read_table(root / "exp" / "mono" / "graph" / "words.txt").items()}
    refs, hyps = {}, {}
    split = "test" if utts[0][0] in read_table(root / "data" / "test" / "utt2spk") else "dev"
    text = read_table(root / "data" / split / "text")
    for (utt, _, _), lp in zip(utts, logpost):
        result = decode.decode(lp - log_prior, graph, tid2pdf, decode.DecoderOptions(acoustic_scale=acwt))
        hyps[utt], refs[utt] = [words[w] for w in result.words], text[utt].split()
    return score(refs, hyps, "plain").total.rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", choices=("mlp", "gru"), default="mlp")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (more threads than free cores slows training by 10x)")
    parser.add_argument("root", type=Path, help="a built corpus (recipe folder holding data/ and exp/)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tm = read_transition_model(args.root / "exp" / "mono" / "final.mdl")
    phone_of_pdf = np.zeros(tm.num_pdfs, dtype=np.int64)
    phone_of_pdf[tm.tid2pdf[1:]] = tm.tid2phone[1:]
    splits = {s: load_split(args.root, s, tm.tid2pdf) for s in ("train", "dev", "test")}
    model = train(args.model, splits["train"], tm.num_pdfs, args.epochs, args.seed)
    counts = np.bincount(np.concatenate([t for _, _, t in splits["train"]]), minlength=tm.num_pdfs)
    log_prior = np.log(np.maximum(counts, 1) / counts.sum()).astype(np.float32)
    for split in ("dev", "test"):
        lp = log_posteriors(model, args.model, splits[split])
        guess = np.concatenate([p.argmax(1) for p in lp])
        truth = np.concatenate([t for _, _, t in splits[split]])
        print(f"{split}: frame accuracy {100 * np.mean(guess == truth):.1f} % (pdfs), "
              f"{100 * np.mean(phone_of_pdf[guess] == phone_of_pdf[truth]):.1f} % (phones)")
        if split == "dev":
            acwt = min((0.05, 0.1, 0.2, 0.3, 0.5), key=lambda a: per(args.root, splits["dev"], lp, log_prior, tm.tid2pdf, a))
        else:
            print(f"test: PER {per(args.root, splits['test'], lp, log_prior, tm.tid2pdf, acwt):.1f} % (acoustic scale {acwt}, picked on dev)")


if __name__ == "__main__":
    main()
