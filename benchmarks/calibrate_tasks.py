"""Cheap proxies that a task is learnable but not trivial.

The real experts are ViTs fine-tuned from the base; these proxies cost seconds per task:

- :func:`ncm_accuracy` / :func:`linear_accuracy` on raw pixels — the "too easy" check: a
  task a nearest-class-mean or linear classifier on pixels already solves (a colour
  task) teaches the merge nothing.
- :func:`cnn_accuracy` — a small CNN trained for a fixed wall-clock budget on luminance
  images (polarity-normalised): a *lower bound* on what an expert can reach, so a task far
  below 90 % here is suspect (ambiguous classes or too little data).
- :func:`pool_features` + :func:`ncm_accuracy` — the same CNN trained on the pretraining
  pool's heads, then class means of its features on each task: a proxy for the base with
  frozen class-prototype heads ("not already solved by a generic base").

``python3 benchmarks/calibrate_tasks.py --suite tasks20`` prints the table
(``acetools/world/vision/data/CALIBRATION.md`` reads it); ``--prepare`` first builds and caches the suite's
tasks in two processes (:func:`prepare`).
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np
import torch
from torch import nn

from acetools.errors import InputError
from acetools.world.vision.data import SUITES, get_task, load_split, pretraining_pool

_LUMA = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)


def luminance(x: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N,3,H,W]`` → float ``[N,1,H,W]``: luminance, standardised per image, sign
    flipped so the border (the background, mostly) is negative."""
    g = (x.float() / 255.0 * _LUMA).sum(1, keepdim=True)
    g = (g - g.mean((2, 3), keepdim=True)) / (g.std((2, 3), keepdim=True) + 1e-3)
    border = torch.cat([g[..., 0, :], g[..., -1, :], g[..., :, 0], g[..., :, -1]], -1).mean(-1)
    return g * torch.where(border > 0, -1.0, 1.0).view(-1, 1, 1, 1)


def _flat(x: torch.Tensor) -> torch.Tensor:
    return (x.float() / 255.0 if x.dtype == torch.uint8 else x.float()).reshape(len(x), -1)


def ncm_accuracy(f_train: torch.Tensor, y_train: torch.Tensor, f_test: torch.Tensor, y_test: torch.Tensor,
                 cosine: bool = False) -> float:
    """Nearest class mean (Euclidean, or cosine on normalised features)."""
    a, b = _flat(f_train), _flat(f_test)
    if cosine:
        a, b = nn.functional.normalize(a, dim=1), nn.functional.normalize(b, dim=1)
    n_classes = int(y_train.max()) + 1
    means = torch.stack([a[y_train == c].mean(0) for c in range(n_classes)])
    if cosine:
        pred = (b @ nn.functional.normalize(means, dim=1).T).argmax(1)
    else:
        pred = torch.cdist(b, means).argmin(1)
    return float((pred == y_test).float().mean())


def linear_accuracy(f_train, y_train, f_test, y_test, epochs: int = 40, lr: float = 1e-2, seed: int = 0) -> float:
    """Softmax regression on standardised features (AdamW, full batch)."""
    a, b = _flat(f_train), _flat(f_test)
    mu, sd = a.mean(0), a.std(0) + 1e-3
    a, b = (a - mu) / sd, (b - mu) / sd
    g = torch.Generator().manual_seed(seed)
    n_classes = int(y_train.max()) + 1
    w = nn.Linear(a.shape[1], n_classes)
    with torch.no_grad():
        w.weight.copy_(torch.randn(w.weight.shape, generator=g) * 0.01)
        w.bias.zero_()
    opt = torch.optim.AdamW(w.parameters(), lr=lr, weight_decay=1e-2)
    for _ in range(epochs):
        loss = nn.functional.cross_entropy(w(a), y_train)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return float((w(b).argmax(1) == y_test).float().mean())


def proxy_cnn(n_out: int | dict[str, int], in_ch: int = 1, width: int = 32) -> nn.Module:
    """Three strided conv layers (16, 8, 4 px) and a linear head on the flattened 4×4 map
    (which keeps position). ``n_out`` a dict gives one head per key (pool pretraining)."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            w = width
            self.trunk = nn.Sequential(
                nn.Conv2d(in_ch, w, 5, 2, 2), nn.BatchNorm2d(w), nn.ReLU(),
                nn.Conv2d(w, 2 * w, 3, 2, 1), nn.BatchNorm2d(2 * w), nn.ReLU(),
                nn.Conv2d(2 * w, 4 * w, 3, 2, 1), nn.BatchNorm2d(4 * w), nn.ReLU(), nn.Flatten(),
                nn.Linear(64 * w, 256), nn.ReLU())
            outs = n_out if isinstance(n_out, dict) else {"y": n_out}
            self.heads = nn.ModuleDict({k: nn.Linear(256, v) for k, v in outs.items()})

        def forward(self, x, features: bool = False):
            f = self.trunk(x)
            if features:
                return f
            out = {k: h(f) for k, h in self.heads.items()}
            return out if isinstance(n_out, dict) else out["y"]

    return Net()


def _train(net, x, targets: dict, seconds: float, max_epochs: int, lr: float, seed: int, batch: int = 128):
    """AdamW with a one-cycle schedule over as many epochs (1..``max_epochs``) as fit in
    ``seconds`` at the speed measured on the first few batches."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    steps_per_epoch = -(-len(x) // batch)

    def step(idx):
        out = net(x[idx])
        out = out if isinstance(out, dict) else {"y": out}
        loss: torch.Tensor | float = 0.0
        for k, t in targets.items():
            t = t[idx]
            ok = t >= 0
            if ok.any():
                loss = loss + nn.functional.cross_entropy(out[k][ok], t[ok])
        if not isinstance(loss, torch.Tensor):
            raise InputError("a training batch without any labelled target (every label is -1)")
        opt.zero_grad()
        loss.backward()
        opt.step()

    net.train()
    for group in opt.param_groups:
        group["lr"] = lr / 25
    t_start = time.perf_counter()
    step(torch.randint(len(x), (batch,), generator=g))  # first call: one-off library set-up
    t0 = time.perf_counter()
    probe = 4
    for _ in range(probe):  # warm-up batches that also time the step
        step(torch.randint(len(x), (batch,), generator=g))
    per_epoch = (time.perf_counter() - t0) / probe * steps_per_epoch
    epochs = int(max(1, min(max_epochs, (seconds - (time.perf_counter() - t_start)) // max(per_epoch, 1e-6))))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=epochs * steps_per_epoch)
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), batch):
            step(perm[i:i + batch])
            sched.step()
    net.eval()
    return epochs


@torch.no_grad()
def _predict(net, x, batch: int = 512, features: bool = False):
    return torch.cat([net(x[i:i + batch], features=features) if features else net(x[i:i + batch])
                      for i in range(0, len(x), batch)])


def cnn_accuracy(x_train, y_train, x_test, y_test, seconds: float = 45.0, max_epochs: int = 12,
                 lr: float = 3e-3, seed: int = 0) -> dict:
    """Train :func:`proxy_cnn` on :func:`luminance` images within ``seconds`` (the one-cycle
    schedule is sized for ``max_epochs``; a budget cut stops it early). Returns test and
    train accuracy and the epochs run."""
    torch.manual_seed(seed)
    a, b = luminance(x_train), luminance(x_test)
    net = proxy_cnn(int(y_train.max()) + 1)
    epochs = _train(net, a, {"y": y_train}, seconds, max_epochs, lr, seed)
    test = float((_predict(net, b).argmax(1) == y_test).float().mean())
    train = float((_predict(net, a[:2000]).argmax(1) == y_train[:2000]).float().mean())
    return {"cnn": test, "cnn_train": train, "epochs": epochs}


def pool_features(pool, seconds: float = 300.0, max_epochs: int = 3, lr: float = 3e-3, seed: int = 0):
    """Train :func:`proxy_cnn` on the pool's heads; returns ``f(x_uint8) -> features``."""
    torch.manual_seed(seed)
    a = luminance(pool.x)
    net = proxy_cnn(dict(pool.head_classes))
    _train(net, a, dict(pool.labels), seconds, max_epochs, lr, seed)
    return lambda x: _predict(net, luminance(x), features=True)


def calibrate(names, root=None, n_train: int = 3000, seconds: float = 45.0, pool=None, pool_seconds: float = 300.0,
              log=None):
    """The proxy table for ``names`` (a list of tasks); ``pool`` (a PretrainData) adds the
    base-proxy column. Returns a pandas DataFrame. ``log``: a callable for one line per task
    (default: this script's logger at INFO level)."""
    if log is None:
        log = logging.getLogger(__name__).info
    import pandas as pd

    feats = pool_features(pool, seconds=pool_seconds) if pool is not None else None
    rows = []
    for name in names:
        t0 = time.perf_counter()
        tr, te = load_split(name, "train", root=root), load_split(name, "test", root=root)
        va = load_split(name, "val", root=root)
        xs, ys = tr.x[:n_train], tr.y[:n_train]
        row = {"task": name, "domain": get_task(name).domain, "classes": tr.n_classes,
               "n_train": len(tr), "n_val": len(va), "n_test": len(te),
               "chance": 1.0 / tr.n_classes,
               "ncm_pixels": ncm_accuracy(xs, ys, te.x, te.y),
               "linear_pixels": linear_accuracy(xs, ys, te.x, te.y)}
        row.update(cnn_accuracy(xs, ys, te.x, te.y, seconds=seconds))
        if feats is not None:
            row["base_proxy_ncm"] = ncm_accuracy(feats(xs), ys, feats(te.x), te.y, cosine=True)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        log(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    return pd.DataFrame(rows)


def prepare(names, root=None, allow_download: bool = False, workers: int = 2) -> None:
    """Build and cache every task of ``names`` that is not cached yet, ``workers`` tasks at a time
    (:func:`acetools.world.vision.data.load_split` builds a whole task and caches it)."""
    import concurrent.futures as cf
    import multiprocessing as mp
    from functools import partial

    build = partial(load_split, split="test", root=root, allow_download=allow_download)
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        for name, _ in zip(names, ex.map(build, names)):
            print("cached", name)


def main(argv=None):  # pragma: no cover - a command-line wrapper
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--suite", default="tasks20")
    p.add_argument("--tasks", nargs="*")
    p.add_argument("--root")
    p.add_argument("--n-train", type=int, default=3000)
    p.add_argument("--seconds", type=float, default=45.0)
    p.add_argument("--pool", action="store_true", help="add the pool-pretrained base proxy")
    p.add_argument("--pool-seconds", type=float, default=300.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", help="CSV file for the table")
    p.add_argument("--prepare", action="store_true", help="first build and cache the tasks in two processes")
    a = p.parse_args(argv)
    if a.prepare:
        prepare(a.tasks or SUITES[a.suite], root=a.root)
    torch.set_num_threads(a.threads)
    pool = pretraining_pool(root=a.root) if a.pool else None
    df = calibrate(a.tasks or SUITES[a.suite], root=a.root, n_train=a.n_train, seconds=a.seconds, pool=pool,
                   pool_seconds=a.pool_seconds, log=print)
    with np.printoptions(precision=3):
        print(df.round(3).to_string(index=False))
    if a.out:
        df.to_csv(a.out, index=False)


if __name__ == "__main__":  # pragma: no cover
    main()
