"""The WMT'14 English–French data of ``SCALE=full``, fetched from its official sources.

``make table1 SCALE=full`` must be able to start from nothing, so the ``data`` step fetches what
``DATA`` lacks (a folder that already holds the files is used as it is). What it writes in ``DATA``
is what :data:`table1.settings.FULL` reads:

* ``train.en.gz``, ``train.fr.gz``: the five parallel corpora of the WMT'14 translation task
  (Europarl v7, Common Crawl, UN, News Commentary v9, the 10⁹ French–English corpus), concatenated
  line-aligned in that order. The paper then selected 348M of their 850M words (Moore & Lewis /
  Axelrod et al.); the ``prepare`` step does that (:mod:`table1.data_selection`).
* ``lm.fr.gz``: WMT'14 news crawl French 2007–2013, then the French side of the training data.
* ``newstest/newstest2011..2014.{en,fr}``: plain text, through sacrebleu's copies of the official
  test sets (the official tarballs, MD5-checked; newstest2014 is the full 3,003-segment version).

Downloads go to ``DATA/downloads/`` and resume after an interruption (HTTP ranges); each output
is written atomically, and a rerun fetches only what is still missing. A pair with invalid UTF-8
on either side is dropped and counted (the official files cannot be fixed by the user, and one
bad line must not stop a day-long run); a corpus whose two sides differ in length is an error.
"""

from __future__ import annotations

import gzip
import http.client
import itertools
import os
import shutil
import sys
import tarfile
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from infrastructure.errors import UserError
from infrastructure.files import atomic_output, fsync_directory
from infrastructure.lines import strip_line_end

STATMT = "https://www.statmt.org/"
LANGS = ("en", "fr")


class DataFetchError(UserError):
    """A download or an archive is not what it should be; the message names the file."""


@dataclass(frozen=True)
class ParallelCorpus:
    """One parallel corpus: the archive (a path under the mirror) and its member, ``{lang}`` inside."""

    name: str
    archive: str
    member: str


PARALLEL: tuple[ParallelCorpus, ...] = (
    ParallelCorpus("europarl-v7", "wmt13/training-parallel-europarl-v7.tgz", "training/europarl-v7.fr-en.{lang}"),
    ParallelCorpus("commoncrawl", "wmt13/training-parallel-commoncrawl.tgz", "commoncrawl.fr-en.{lang}"),
    ParallelCorpus("un", "wmt13/training-parallel-un.tgz", "un/undoc.2000.fr-en.{lang}"),
    ParallelCorpus("news-commentary-v9", "wmt14/training-parallel-nc-v9.tgz",
                   "training/news-commentary-v9.fr-en.{lang}"),
    ParallelCorpus("giga-fren", "wmt10/training-giga-fren.tar", "giga-fren.release2.fixed.{lang}.gz"),
)
NEWS_CRAWL: tuple[str, ...] = tuple(
    f"wmt14/training-monolingual-news-crawl/news.{year}.fr.shuffled.gz" for year in range(2007, 2014)
)
# newstest name -> sacrebleu test set (the official tarball of that year's evaluation)
TEST_SETS: dict[str, str] = {
    "newstest2011": "wmt11", "newstest2012": "wmt12", "newstest2013": "wmt13", "newstest2014": "wmt14/full",
}
TRAIN_FILES = tuple(f"train.{lang}.gz" for lang in LANGS)
LM_FILE = "lm.fr.gz"


def provides(relative: str) -> bool:
    """True if :func:`fetch` makes ``DATA/relative`` (so a missing one can be fetched, not refused)."""
    return relative in TRAIN_FILES or relative == LM_FILE or _test_set_of(relative) is not None


def _test_set_of(relative: str) -> tuple[str, str] | None:
    """``("newstest2012", "en")`` for ``newstest/newstest2012.en``; None for anything else."""
    folder, _, name = relative.partition("/")
    stem, _, lang = name.rpartition(".")
    return (stem, lang) if folder == "newstest" and stem in TEST_SETS and lang in LANGS else None


def _say(message: str) -> None:
    print(f"[wmt14] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# downloads


def download(url: str, dest: Path, *, progress: bool = True, timeout: float = 60.0) -> Path:
    """Fetch ``url`` to ``dest`` unless it is there; an interrupted download resumes.

    The bytes go to ``dest.partial`` (a fixed name, unlike the project's atomic writes, so that a
    rerun can ask the server for the rest with an HTTP range) and are renamed to ``dest`` only when
    the length the server announced has arrived. A server that ignores the range sends the whole
    file again, which then replaces the partial one.
    """
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    have = partial.stat().st_size if partial.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # nothing after what we have: complete, or longer than the file
            if exc.headers.get("Content-Range", "") == f"bytes */{have}":
                _finish_download(partial, dest)
                return dest
            partial.unlink()
            return download(url, dest, progress=progress, timeout=timeout)
        raise DataFetchError(f"{url}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise DataFetchError(f"{url}: {getattr(exc, 'reason', exc)}") from exc
    with response:
        resumed = response.status == 206
        length = response.headers.get("Content-Length")
        total = (have if resumed else 0) + int(length) if length is not None else None
        _say(f"{'resuming' if resumed else 'downloading'} {url} -> {dest}"
             + (f" ({total / 1e6:,.1f} MB)" if total is not None else ""))
        with open(partial, "ab" if resumed else "wb") as out:
            _copy_stream(response, out, url, total=total, initial=have if resumed else 0, progress=progress)
    got = partial.stat().st_size
    if total is not None and got != total:
        raise DataFetchError(f"{url}: the connection ended after {got:,} of {total:,} bytes; "
                             f"rerun to resume ({partial} is kept)")
    _finish_download(partial, dest)
    return dest


def _copy_stream(src: BinaryIO, out: BinaryIO, url: str, *, total: int | None, initial: int, progress: bool) -> None:
    from infrastructure.progress import progress_bar  # tqdm only where a download runs

    with progress_bar(total=total, initial=initial, unit="B", unit_scale=True, show=progress,
                      desc=url.rsplit("/", 1)[-1]) as bar:
        while True:
            try:
                chunk = src.read(1 << 20)
            except (OSError, http.client.HTTPException) as exc:  # dropped: keep what arrived
                out.flush()
                raise DataFetchError(f"{url}: download interrupted ({exc}); rerun to resume") from exc
            if not chunk:
                return
            out.write(chunk)
            bar.update(len(chunk))


def _finish_download(partial: Path, dest: Path) -> None:
    with open(partial, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(partial, dest)
    fsync_directory(dest.parent)


# --------------------------------------------------------------------------------------------
# archives and corpora


def member_lines(archive: Path, member: str) -> Iterator[bytes]:
    """The raw lines (``\\n`` kept) of one member of a tar archive, gunzipped if it is ``.gz``.

    The archive is read as a stream (``r|*``), one pass up to the member, so a 2.6 GB tar costs
    no seeking and no extraction to disk.
    """
    try:
        with tarfile.open(archive, "r|*") as tar:
            for info in tar:
                if info.name.removeprefix("./") != member:
                    continue
                fh = tar.extractfile(info)
                if fh is None:
                    raise DataFetchError(f"{archive}: {member} is not a regular file")
                stream: BinaryIO = gzip.GzipFile(fileobj=fh) if member.endswith(".gz") else fh  # type: ignore[assignment]
                yield from stream
                return
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise DataFetchError(f"{archive}: damaged archive ({exc}); delete it and rerun") from exc
    raise DataFetchError(f"{archive}: no member {member}")


def gzip_lines(path: Path) -> Iterator[bytes]:
    """The raw lines of a ``.gz`` file (news crawl), with a clear error if it is damaged."""
    try:
        with gzip.open(path, "rb") as fh:
            yield from fh
    except (EOFError, OSError) as exc:
        raise DataFetchError(f"{path}: damaged gzip file ({exc}); delete it and rerun") from exc


def _text(raw: bytes) -> bytes | None:
    """``raw`` with its line end normalised to ``\\n``; None if it is not UTF-8."""
    line = strip_line_end(raw)
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return line + b"\n"


def write_parallel(corpora: Iterable[tuple[str, Iterator[bytes], Iterator[bytes]]], out_src: Path,
                   out_tgt: Path) -> dict[str, dict[str, int]]:
    """Concatenate line-aligned corpora into ``out_src`` and ``out_tgt`` (both or neither).

    Returns per corpus the pairs kept and the pairs dropped for invalid UTF-8. Two sides of
    different lengths raise :class:`DataFetchError`: the corpus would be misaligned from there on.
    """
    counts: dict[str, dict[str, int]] = {}
    with atomic_output(out_src) as fs, atomic_output(out_tgt) as ft:
        for name, src, tgt in corpora:
            kept = dropped = 0
            for pair_no, (a, b) in enumerate(itertools.zip_longest(src, tgt), start=1):
                if a is None or b is None:
                    longer, shorter = ("target", "source") if a is None else ("source", "target")
                    raise DataFetchError(f"{name}: the {shorter} side ends at line {pair_no - 1}, "
                                         f"the {longer} side goes on")
                ta, tb = _text(a), _text(b)
                if ta is None or tb is None:
                    dropped += 1
                    continue
                fs.write(ta)
                ft.write(tb)
                kept += 1
            counts[name] = {"pairs": kept, "dropped_not_utf8": dropped}
            _say(f"{name}: {kept:,} pairs" + (f" ({dropped:,} dropped: not UTF-8)" if dropped else ""))
    return counts


def write_monolingual(sources: Iterable[tuple[str, Iterator[bytes]]], out: Path) -> dict[str, dict[str, int]]:
    """Concatenate text sources into ``out``; lines that are not UTF-8 are dropped and counted."""
    counts: dict[str, dict[str, int]] = {}
    with atomic_output(out) as fh:
        for name, lines in sources:
            kept = dropped = 0
            for raw in lines:
                text = _text(raw)
                if text is None:
                    dropped += 1
                    continue
                fh.write(text)
                kept += 1
            counts[name] = {"lines": kept, "dropped_not_utf8": dropped}
            _say(f"{name}: {kept:,} lines" + (f" ({dropped:,} dropped: not UTF-8)" if dropped else ""))
    return counts


# --------------------------------------------------------------------------------------------
# test sets


def fetch_test_set(name: str, data: Path, datasets: Mapping[str, object] | None = None) -> int:
    """``DATA/newstest/NAME.{en,fr}`` from sacrebleu's copy of the official test set; returns lines."""
    if datasets is None:
        from sacrebleu.dataset import DATASETS as datasets  # sacrebleu's registry
    dataset = datasets[TEST_SETS[name]]
    try:
        source = Path(dataset.get_source_file("en-fr"))  # type: ignore[attr-defined]
        reference = Path(dataset.get_reference_files("en-fr")[0])  # type: ignore[attr-defined]
    except SystemExit as exc:  # sacrebleu exits on a failed download or a wrong MD5 (it logs why)
        raise DataFetchError(f"{name}: sacrebleu could not fetch {TEST_SETS[name]} (see its message above)") from exc
    except OSError as exc:
        raise DataFetchError(f"{name}: sacrebleu could not fetch {TEST_SETS[name]} ({exc})") from exc
    counts = {path: _count_lines(path) for path in (source, reference)}
    if counts[source] != counts[reference]:
        raise DataFetchError(f"{name}: {source} has {counts[source]} lines but {reference} {counts[reference]}")
    out = data / "newstest"
    out.mkdir(parents=True, exist_ok=True)
    for path, lang in ((source, "en"), (reference, "fr")):
        with open(path, "rb") as src, atomic_output(out / f"{name}.{lang}") as dst:
            shutil.copyfileobj(src, dst)
    _say(f"{name}: {counts[source]:,} segments -> {out}/{name}.{{en,fr}}")
    return counts[source]


def _count_lines(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for _ in fh)


# --------------------------------------------------------------------------------------------
# the whole data folder


def fetch(data: Path, wanted: Iterable[str], *, mirror: str = STATMT, progress: bool = True,
          datasets: Mapping[str, object] | None = None) -> dict[str, object]:
    """Make the files of ``wanted`` (paths relative to ``data``, each one :func:`provides`).

    ``mirror`` replaces ``https://www.statmt.org/`` for the training and LM archives (the test
    sets come through sacrebleu). Returns what was written, with line counts, for the step's stamp.
    """
    wanted = sorted(set(wanted))
    unknown = [w for w in wanted if not provides(w)]
    if unknown:
        raise DataFetchError(f"cannot fetch {', '.join(unknown)}: not part of the WMT'14 en-fr data")
    base = mirror if mirror.endswith("/") else mirror + "/"
    downloads = data / "downloads"
    done: dict[str, object] = {}

    def archive(path: str) -> Path:
        return download(base + path, downloads / path.rsplit("/", 1)[-1], progress=progress)

    need_train = any(w in TRAIN_FILES for w in wanted) or (LM_FILE in wanted and not _train_complete(data))
    if need_train:
        paths = {c.name: archive(c.archive) for c in PARALLEL}
        done["train"] = write_parallel(
            ((c.name, member_lines(paths[c.name], c.member.format(lang="en")),
              member_lines(paths[c.name], c.member.format(lang="fr"))) for c in PARALLEL),
            data / TRAIN_FILES[0], data / TRAIN_FILES[1])
    if LM_FILE in wanted:
        news = [(path.rsplit("/", 1)[-1], archive(path)) for path in NEWS_CRAWL]
        done["lm"] = write_monolingual(
            [*((name, gzip_lines(path)) for name, path in news), ("train.fr.gz", gzip_lines(data / TRAIN_FILES[1]))],
            data / LM_FILE)
    for name in sorted({t[0] for w in wanted if (t := _test_set_of(w))}):
        done[name] = fetch_test_set(name, data, datasets)
    return done


def _train_complete(data: Path) -> bool:
    return all((data / name).exists() for name in TRAIN_FILES)

