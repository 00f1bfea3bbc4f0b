"""SCALE=full's data fetching (table1.wmt14) against a local HTTP server holding archives laid out as
the official WMT'14 ones: what lands in DATA, resumed downloads, and the errors a user can act on."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from table1 import systems, wmt14, workspace
from table1.settings import FULL, SCALES


class _Server(ThreadingHTTPServer):
    root: Path
    honour_range = True
    cut: dict[str, int]
    requests: list[tuple[str, str | None]]


class _Handler(BaseHTTPRequestHandler):
    """Static files with HTTP ranges (or without, ``honour_range=False``); ``cut[path]`` sends
    only that many bytes of the next response to ``path`` and drops the connection."""

    server: _Server

    def do_GET(self) -> None:  # http.server's name
        path = self.server.root / self.path.lstrip("/")
        range_header = self.headers.get("Range")
        self.server.requests.append((self.path, range_header))
        if not path.is_file():
            self.send_error(404, "Not Found")
            return
        data = path.read_bytes()
        start = 0
        if range_header and self.server.honour_range:
            start = int(range_header.removeprefix("bytes=").rstrip("-"))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        cut = self.server.cut.pop(self.path, None)
        self.wfile.write(body if cut is None else body[:cut])

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def server(tmp_path):
    root = tmp_path / "mirror"
    root.mkdir()
    httpd = _Server(("127.0.0.1", 0), _Handler)
    httpd.root, httpd.cut, httpd.requests = root, {}, []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _url(server: _Server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/"


def _tar(path: Path, members: dict[str, bytes], mode: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, mode) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


# Each corpus: (en lines, fr lines) as raw bytes, with what the official files hold: CRLF ends,
# accents, and one pair whose French side is not UTF-8 (dropped with its English side).
CORPORA = {
    "europarl-v7": ([b"Resumption of the session\n", b"I declare\r\n"],
                    [b"Reprise de la session\n", "Je déclare\r\n".encode()]),
    "commoncrawl": ([b"Hello world\n", b"bad pair\n", b"last line without newline"],
                    [b"Bonjour le monde\n", b"mauvaise \xe9 paire\n", "dernière ligne".encode()]),
    "un": ([b"United Nations\n"], [b"Nations Unies\n"]),
    "news-commentary-v9": ([b"Gold\n", b"\n"], [b"L'or\n", b"\n"]),
    "giga-fren": ([b"Giga one\n", b"Giga two\n"], [b"Giga un\n", b"Giga deux\n"]),
}
EXPECTED_EN = ["Resumption of the session", "I declare", "Hello world", "last line without newline",
               "United Nations", "Gold", "", "Giga one", "Giga two"]
EXPECTED_FR = ["Reprise de la session", "Je déclare", "Bonjour le monde", "dernière ligne", "Nations Unies",
               "L'or", "", "Giga un", "Giga deux"]
NEWS = {year: [f"Nouvelle {year} a\n".encode(), f"Nouvelle {year} b\n".encode()] for year in range(2007, 2014)}


def _publish(root: Path) -> None:
    """Archives with the official names and members (table1.wmt14's tables) under ``root``."""
    for corpus in wmt14.PARALLEL:
        en, fr = CORPORA[corpus.name]
        if corpus.archive.endswith(".tar"):  # the 10^9 corpus: a plain tar of two .gz files
            members = {corpus.member.format(lang="en"): gzip.compress(b"".join(en)),
                       corpus.member.format(lang="fr"): gzip.compress(b"".join(fr))}
            _tar(root / corpus.archive, members, "w")
        else:
            members = {corpus.member.format(lang="en"): b"".join(en), corpus.member.format(lang="fr"): b"".join(fr),
                       "training/other.de-en.de": b"noise\n"}
            _tar(root / corpus.archive, members, "w:gz")
    for year, path in zip(range(2007, 2014), wmt14.NEWS_CRAWL, strict=True):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(gzip.compress(b"".join(NEWS[year])))


def _gz_lines(path: Path) -> list[str]:
    return gzip.decompress(path.read_bytes()).decode("utf-8").split("\n")[:-1]


def test_fetch_builds_the_training_and_lm_text_from_the_official_archives(server, tmp_path):
    _publish(server.root)
    data = tmp_path / "data"
    done = wmt14.fetch(data, ["train.en.gz", "train.fr.gz", "lm.fr.gz"], mirror=_url(server), progress=False)

    assert _gz_lines(data / "train.en.gz") == EXPECTED_EN
    assert _gz_lines(data / "train.fr.gz") == EXPECTED_FR
    news = [line.decode().rstrip("\n") for year in range(2007, 2014) for line in NEWS[year]]
    assert _gz_lines(data / "lm.fr.gz") == news + EXPECTED_FR
    assert done["train"]["commoncrawl"] == {"pairs": 2, "dropped_not_utf8": 1}
    assert sum(c["pairs"] for c in done["train"].values()) == len(EXPECTED_EN)
    # every archive was downloaded once, into DATA/downloads
    assert sorted(p.name for p in (data / "downloads").iterdir()) == sorted(
        [c.archive.rsplit("/", 1)[-1] for c in wmt14.PARALLEL] + [p.rsplit("/", 1)[-1] for p in wmt14.NEWS_CRAWL])

    # A rerun asking only for the LM text reuses the training text and the downloads.
    (data / "lm.fr.gz").unlink()
    before = len(server.requests)
    wmt14.fetch(data, ["lm.fr.gz"], mirror=_url(server), progress=False)
    assert len(server.requests) == before
    assert _gz_lines(data / "lm.fr.gz") == news + EXPECTED_FR


@pytest.mark.parametrize("honour_range", [True, False])
def test_an_interrupted_download_resumes_and_ends_byte_identical(server, tmp_path, honour_range):
    payload = bytes(range(256)) * 4000
    (server.root / "big.bin").write_bytes(payload)
    server.honour_range = honour_range
    server.cut["/big.bin"] = 300_000
    dest = tmp_path / "dl" / "big.bin"

    with pytest.raises(wmt14.DataFetchError, match="rerun to resume"):
        wmt14.download(_url(server) + "big.bin", dest, progress=False)
    assert not dest.exists()
    partial = dest.with_name("big.bin.partial")
    assert 0 < partial.stat().st_size < len(payload)

    wmt14.download(_url(server) + "big.bin", dest, progress=False)
    assert dest.read_bytes() == payload
    assert not partial.exists()
    assert server.requests[-1][1] == f"bytes={300_000}-"  # the rerun asked only for the rest


def test_a_complete_partial_file_is_taken_and_an_overlong_one_fetched_again(server, tmp_path):
    (server.root / "f.bin").write_bytes(b"abc")
    dest = tmp_path / "f.bin"
    dest.with_name("f.bin.partial").write_bytes(b"abc")
    wmt14.download(_url(server) + "f.bin", dest, progress=False)
    assert dest.read_bytes() == b"abc" and len(server.requests) == 1
    # a partial file longer than the file (the file changed on the server): start afresh
    other = tmp_path / "g.bin"
    other.with_name("g.bin.partial").write_bytes(b"abcdef")
    wmt14.download(_url(server) + "f.bin", other, progress=False)
    assert other.read_bytes() == b"abc" and server.requests[-1] == ("/f.bin", None)


def test_errors_name_the_url_or_the_archive(server, tmp_path):
    with pytest.raises(wmt14.DataFetchError, match=r"missing\.tgz: HTTP 404"):
        wmt14.download(_url(server) + "missing.tgz", tmp_path / "missing.tgz", progress=False)
    archive = tmp_path / "a.tgz"
    _tar(archive, {"x.en": b"a\n"}, "w:gz")
    with pytest.raises(wmt14.DataFetchError, match=r"a\.tgz: no member x\.fr"):
        list(wmt14.member_lines(archive, "x.fr"))
    damaged = tmp_path / "damaged.tgz"
    damaged.write_bytes(archive.read_bytes()[:20])
    with pytest.raises(wmt14.DataFetchError, match=r"damaged\.tgz: damaged archive"):
        list(wmt14.member_lines(damaged, "x.en"))


def test_sides_of_different_lengths_stop_and_write_nothing(tmp_path):
    corpora = [("ok", iter([b"a\n"]), iter([b"b\n"])), ("short-fr", iter([b"a\n", b"b\n", b"c\n"]), iter([b"x\n"]))]
    with pytest.raises(wmt14.DataFetchError, match="short-fr: the target side ends at line 1"):
        wmt14.write_parallel(corpora, tmp_path / "t.en.gz", tmp_path / "t.fr.gz")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _sgm(lines: list[str], lang: str) -> bytes:
    segs = "".join(f'<seg id="{i}">{line}</seg>\n' for i, line in enumerate(lines, start=1))
    return f'<srcset setid="t" srclang="any">\n<doc sysid="ref" docid="d1" genre="news" origlang="{lang}">\n' \
           f"{segs}</doc>\n</srcset>\n".encode()


def _fake_test_set(server: _Server, tmp_path: Path, monkeypatch, name: str, year: int):
    """A sacrebleu dataset of the official kind, served locally with its MD5, cached under tmp_path."""
    import sacrebleu.dataset.base as sb_base
    from sacrebleu.dataset.fake_sgml import FakeSGMLDataset

    monkeypatch.setattr(sb_base, "SACREBLEU_DIR", str(tmp_path / "sacrebleu"))
    members = {f"test/newstest{year}-src.en.sgm": _sgm(["A  first  sentence. ", "Second &amp; last."], "en"),
               f"test/newstest{year}-src.fr.sgm": _sgm(["Une première phrase.", "Deuxième et dernière."], "fr")}
    tarball = server.root / f"{name.replace('/', '_')}.tgz"
    _tar(tarball, members, "w:gz")
    md5 = hashlib.md5(tarball.read_bytes()).hexdigest()
    return FakeSGMLDataset(name, data=[_url(server) + tarball.name], md5=[md5], langpairs={"en-fr": list(members)})


def test_test_sets_come_from_sacrebleu_as_plain_text(server, tmp_path, monkeypatch):
    dataset = _fake_test_set(server, tmp_path, monkeypatch, "wmt12", 2012)
    data = tmp_path / "data"
    done = wmt14.fetch(data, ["newstest/newstest2012.en", "newstest/newstest2012.fr"], datasets={"wmt12": dataset})
    assert done == {"newstest2012": 2}
    # sacrebleu's own cleaning: spaces collapsed and stripped; the SGM's entities are kept as written
    assert (data / "newstest" / "newstest2012.en").read_text(encoding="utf-8") == \
        "A first sentence.\nSecond &amp; last.\n"
    assert (data / "newstest" / "newstest2012.fr").read_text(encoding="utf-8") == \
        "Une première phrase.\nDeuxième et dernière.\n"


def test_a_wrong_checksum_is_a_clear_error(server, tmp_path, monkeypatch):
    dataset = _fake_test_set(server, tmp_path, monkeypatch, "wmt13", 2013)
    dataset.md5 = ["0" * 32]
    with pytest.raises(wmt14.DataFetchError, match="newstest2013: sacrebleu could not fetch wmt13"):
        wmt14.fetch(tmp_path / "data", ["newstest/newstest2013.en"], datasets={"wmt13": dataset})


def test_only_the_wmt14_files_can_be_fetched():
    assert wmt14.provides("train.en.gz") and wmt14.provides("lm.fr.gz")
    assert wmt14.provides("newstest/newstest2014.fr")
    assert not wmt14.provides("newstest/newstest2010.fr")
    assert not wmt14.provides("hansard/hansard.en.gz")
    with pytest.raises(wmt14.DataFetchError, match="cannot fetch hansard"):
        wmt14.fetch(Path("unused"), ["hansard/hansard.en.gz"])


def test_full_scale_data_step_fetches_what_data_lacks_and_nothing_else(server, tmp_path, monkeypatch):
    """DATA holds everything but newstest2014: the data step fetches only that (through sacrebleu),
    then slices as usual. A missing file that is not WMT'14 data is refused before any download."""
    import sacrebleu.dataset as sb

    data = tmp_path / "data"
    for lang, lines in (("en", EXPECTED_EN), ("fr", EXPECTED_FR)):
        (data / "newstest").mkdir(parents=True, exist_ok=True)
        (data / f"train.{lang}.gz").write_bytes(gzip.compress("".join(f"{x}\n" for x in lines).encode()))
        for year in (2011, 2012, 2013):
            (data / "newstest" / f"newstest{year}.{lang}").write_text(f"{lang} {year}\n", encoding="utf-8")
    (data / "lm.fr.gz").write_bytes(gzip.compress(b"lm line\n"))
    dataset = _fake_test_set(server, tmp_path, monkeypatch, "wmt14/full", 2014)
    monkeypatch.setitem(sb.DATASETS, "wmt14/full", dataset)

    exp = workspace.Experiment(work=tmp_path / "work", settings=FULL, data=data)
    exp.work.mkdir()
    assert systems.missing_inputs(exp) == ["newstest/newstest2014.en", "newstest/newstest2014.fr"]
    systems.step_data(exp, mirror=_url(server))
    assert (exp.path("raw", "test.fr")).read_text(encoding="utf-8") == "Une première phrase.\nDeuxième et dernière.\n"
    assert (exp.path("raw", "dev.en")).read_text(encoding="utf-8") == "en 2012\nen 2013\n"
    assert [r for r in server.requests if "training" in r[0]] == []

    # SCALE=small reads Hansard, which is not WMT'14 data: refused, naming the files, with no download.
    monkeypatch.setattr(wmt14, "fetch", lambda *a, **k: pytest.fail("must not download"))
    small = workspace.Experiment(work=tmp_path / "work-small", settings=SCALES["small"], data=data)
    small.work.mkdir()
    with pytest.raises(workspace.ExperimentError, match=r"missing input\(s\) .*hansard/hansard\.en\.gz"):
        systems.step_data(small)
    assert not small.done("data")
