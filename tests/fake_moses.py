"""A fake ``moses`` for the tuning loop's tests, and the small dev set it decodes.

The fake has a tiny, fixed search space: the real 100-best lists of the fixture's first dev
sentences. For each sentence it returns the top-K of that pool under the weights in the ini it is
given, so new weights bring new hypotheses, as with the real decoder, and everything about the
loop except the decoder itself runs for real (ini writing, merging, MERT, state, resume).
"""

from __future__ import annotations

import gzip
import stat
import sys
from pathlib import Path

from mert.tune import TuneOptions
from shared_paths import shared_file

FIXTURE = "fixtures/hansard-enfr"
SENTENCES = 12
TOP_K = 8

FAKE_MOSES = r'''#!{python}
"""Fake moses: returns each sentence's top-K of a fixed hypothesis pool under the ini's weights."""
import os, sys

args = sys.argv[1:]
if os.environ.get("FAKE_MOSES_FAIL"):
    sys.stderr.write("Defined parameters (per moses.ini or switch):\n" * 30)
    sys.stderr.write("Exception: Size of scoreVector != number (4!=5) of score components\n")
    sys.exit(1)
ini = args[args.index("-f") + 1]
i = args.index("-n-best-list")
nbest_path, size = args[i + 1], int(args[i + 2])
weights, section = {{}}, None
for raw in open(ini, encoding="utf-8"):
    line = raw.split("#", 1)[0].strip()
    if line.startswith("["):
        section = line
    elif section == "[weight]" and line:
        name, *vals = line.split()
        weights[name[:-1]] = [float(v) for v in vals]
static = bool(os.environ.get("FAKE_MOSES_STATIC"))
pool = {{}}
for line in open({pool!r}, encoding="utf-8"):
    sid, hyp, feats, total = line.rstrip("\n").split(" ||| ")[:4]
    score, name, k = 0.0, None, 0
    for tok in feats.split():
        if tok.endswith("="):
            name, k = tok[:-1], 0
        else:
            score += weights[name][k] * float(tok)
            k += 1
    pool.setdefault(int(sid), []).append((0.0 if static else score, hyp, feats))
src = sys.stdin.read().splitlines()
with open(nbest_path, "w", encoding="utf-8") as nb:
    for s in range(len(src)):
        ranked = sorted(pool[s], key=lambda x: -x[0])[: min(size, {top_k})]
        for score, hyp, feats in ranked:
            nb.write(f"{{s}} ||| {{hyp}} ||| {{feats}} ||| {{score:.6g}}\n")
        print(ranked[0][1].strip())
'''


def fake_dev(tmp_path: Path) -> dict[str, Path]:
    """A small dev set (source, reference, hypothesis pool) and a fake moses bin dir."""
    root = shared_file(FIXTURE)
    lines = gzip.decompress((root / "nbest/dev.nbest.gz").read_bytes()).decode("utf-8").splitlines()
    pool = tmp_path / "pool.nbest"
    pool.write_text("".join(f"{x}\n" for x in lines if int(x.split(" ||| ", 1)[0]) < SENTENCES), encoding="utf-8")
    paths = {"pool": pool, "ini": root / "filtered/moses.ini"}
    for key, name in (("src", "dev.tok.tc.en"), ("ref", "dev.tok.tc.fr")):
        text = (root / "data" / name).read_text(encoding="utf-8").splitlines()[:SENTENCES]
        paths[key] = tmp_path / name
        paths[key].write_text("".join(f"{x}\n" for x in text), encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "moses"
    fake.write_text(FAKE_MOSES.format(python=sys.executable, pool=str(pool), top_k=TOP_K), encoding="utf-8")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    paths["bin"] = bin_dir
    return paths


def tune_options(dev: dict[str, Path], work: Path, **kw: object) -> TuneOptions:
    """``mert tune``'s options on the fake dev set (5 restarts: fast, and enough to move)."""
    base: dict[str, object] = dict(
        ini=dev["ini"], source=dev["src"], references=[dev["ref"]], work_dir=work, moses_bin_dir=dev["bin"],
        restarts=5,
    )
    base.update(kw)
    return TuneOptions(**base)  # type: ignore[arg-type]


def quiet(_: str) -> None:
    """A log that says nothing."""
