"""Generate ``examples/phrase-table.en-fr.gz``, the project's small built-in phrase table, and the
word translation tables ``lex.f2e``/``lex.e2f`` beside it (what ``rescorer propose`` reads).

Why a generator rather than a checked-in table only: the sample must be ours (hand-written
translations, not an excerpt of someone's trained system), reproducible byte for byte, and easy
to extend. Run ``python examples/make_sample.py`` from anywhere; the output does not depend on
time, locale or the Python hash seed.

The table imitates what Moses' ``train-model.perl`` writes, so the rest of the project can be
exercised on it without a trained system:

* text tokenised and lowercased like Moses' tokenizer output, with ``'`` escaped as ``&apos;``
  (``l&apos; économie``, ``it &apos;s``);
* ``source ||| target ||| p(s|t) lex(s|t) p(t|s) lex(t|s) ||| alignment ||| c(t) c(s) c(s,t) ||| |||``
  (the trailing empty sparse/properties fields, as Moses writes them);
* phrase probabilities are relative frequencies of the counts; the lexical weights are computed
  from word translation probabilities estimated on the aligned word pairs of all entries (the
  unaligned words going to NULL), as Koehn et al.'s lexical weighting does;
* lines sorted in ``LC_ALL=C`` byte order of the whole line, as Moses tables are, so each
  source phrase forms one contiguous block;
* ``lex.f2e`` and ``lex.e2f`` hold the word translation probabilities those lexical weights come
  from, as ``train-model.perl`` step 4 writes them beside a trained table.
"""

from __future__ import annotations

import gzip
import random
from collections import defaultdict
from pathlib import Path

SEED = 20140603
OUT = Path(__file__).resolve().parent / "phrase-table.en-fr.gz"
NULL = "<null>"

# source -> [(target, pair count, alignment)]; alignment None means one-to-one, monotone
# (only for targets as long as the source). Counts are invented but keep plausible ratios.
Entry = tuple[str, int, str | None]
LEXICON: list[tuple[str, list[Entry]]] = [
    # ---- single words
    ("the", [("le", 420, None), ("la", 380, None), ("les", 310, None), ("l&apos;", 150, None)]),
    ("house", [("chambre", 210, None), ("maison", 45, None), ("assemblée", 12, None)]),
    ("parliament", [("parlement", 260, None), ("législature", 18, None), ("chambre", 9, None)]),
    ("government", [("gouvernement", 540, None), ("administration", 14, None), ("état", 11, None)]),
    ("minister", [("ministre", 330, None), ("secrétaire", 6, None)]),
    ("member", [("député", 240, None), ("membre", 70, None), ("députée", 35, None)]),
    ("members", [("députés", 260, None), ("membres", 90, None), ("parlementaires", 25, None)]),
    ("country", [("pays", 310, None), ("nation", 22, None)]),
    ("canada", [("canada", 480, None), ("pays", 15, None)]),
    ("canadians", [("canadiens", 290, None), ("canadiennes", 40, None), ("population", 14, None)]),
    (
        "people",
        [("gens", 160, None), ("personnes", 120, None), ("population", 60, None), ("peuple", 45, None)],
    ),
    ("bill", [("projet", 210, None), ("loi", 95, None), ("mesure", 30, None)]),
    ("question", [("question", 350, None), ("sujet", 20, None), ("problème", 18, None)]),
    ("debate", [("débat", 190, None), ("discussion", 25, None)]),
    ("committee", [("comité", 260, None), ("commission", 30, None)]),
    ("motion", [("motion", 180, None), ("proposition", 12, None)]),
    ("time", [("temps", 140, None), ("fois", 80, None), ("moment", 55, None)]),
    ("year", [("année", 170, None), ("an", 90, None), ("exercice", 20, None)]),
    ("years", [("ans", 230, None), ("années", 150, None)]),
    ("today", [("aujourd&apos; hui", 260, "0-0 0-1"), ("ce", 8, None)]),
    ("must", [("doit", 150, None), ("devons", 120, None), ("faut", 70, None)]),
    ("think", [("pense", 210, None), ("crois", 95, None), ("estime", 40, None)]),
    ("support", [("appui", 140, None), ("soutien", 110, None), ("appuyer", 75, None)]),
    ("important", [("important", 220, None), ("importante", 90, None), ("essentiel", 15, None)]),
    ("new", [("nouveau", 150, None), ("nouvelle", 120, None), ("nouveaux", 60, None)]),
    ("all", [("tous", 260, None), ("toutes", 110, None), ("tout", 90, None)]),
    ("not", [("pas", 380, None), ("ne", 260, None), ("non", 30, None)]),
    ("we", [("nous", 620, None), ("on", 85, None)]),
    ("i", [("je", 540, None), ("j&apos;", 130, None), ("moi", 25, None)]),
    ("is", [("est", 600, None), ("a", 35, None)]),
    ("are", [("sont", 310, None), ("sommes", 80, None), ("êtes", 40, None)]),
    ("this", [("ce", 260, None), ("cette", 220, None), ("cela", 70, None), ("ceci", 30, None)]),
    ("that", [("que", 520, None), ("qui", 140, None), ("cela", 60, None), ("ce", 45, None)]),
    ("of", [("de", 980, None), ("des", 320, None), ("du", 290, None), ("d&apos;", 150, None)]),
    ("in", [("dans", 420, None), ("en", 310, None), ("au", 120, None), ("à", 95, None)]),
    ("to", [("à", 560, None), ("de", 310, None), ("pour", 120, None)]),
    ("and", [("et", 1200, None), (",", 40, None)]),
    ("for", [("pour", 430, None), ("de", 60, None), ("à", 35, None)]),
    ("with", [("avec", 310, None), ("de", 40, None)]),
    ("on", [("sur", 350, None), ("le", 30, None)]),
    ("speaker", [("président", 310, None), ("présidente", 25, None)]),
    ("party", [("parti", 270, None), ("formation", 12, None)]),
    ("province", [("province", 190, None)]),
    ("provinces", [("provinces", 230, None)]),
    ("budget", [("budget", 310, None), ("budgétaire", 40, None)]),
    ("tax", [("impôt", 140, None), ("fiscal", 60, None), ("taxe", 55, None)]),
    ("economy", [("économie", 230, None)]),
    ("health", [("santé", 270, None)]),
    ("jobs", [("emplois", 250, None), ("travail", 15, None)]),
    ("job", [("emploi", 140, None), ("travail", 35, None)]),
    ("creation", [("création", 110, None)]),
    ("vote", [("vote", 120, None), ("voter", 70, None), ("scrutin", 15, None)]),
    ("law", [("loi", 240, None), ("droit", 60, None)]),
    ("very", [("très", 310, None), ("fort", 18, None)]),
    ("mr.", [("monsieur", 420, None), ("m.", 180, None)]),
    ("hon.", [("honorable", 60, None)]),
    ("finance", [("finances", 180, None), ("finance", 25, None)]),
    ("federal", [("fédéral", 260, None), ("fédérale", 90, None)]),
    ("opposition", [("opposition", 210, None)]),
    ("official", [("officielle", 130, None), ("officiel", 45, None)]),
    ("unemployment", [("chômage", 170, None), ("assurance-chômage", 40, None)]),
    ("insurance", [("assurance", 160, None), ("assurance-chômage", 40, None)]),
    ("thank", [("remercie", 90, None), ("merci", 70, None)]),
    ("you", [("vous", 330, None), ("tu", 6, None)]),
    ("our", [("notre", 260, None), ("nos", 150, None)]),
    ("first", [("premier", 150, None), ("première", 90, None), ("premières", 30, None)]),
    ("nations", [("nations", 80, None)]),
    ("course", [("évidemment", 50, None), ("cours", 35, None)]),
    ("would", [("serait", 60, None), ("aimerais", 20, None)]),
    ("like", [("comme", 80, None), ("voudrais", 60, None), ("aimerais", 30, None)]),
    ("do", [("faire", 70, None), ("ne", 50, None)]),
    ("it", [("il", 210, None), ("c&apos;", 95, None), ("cela", 60, None)]),
    ("&apos;s", [("est", 120, None), ("de", 20, None)]),
    ("have", [("avons", 200, None), ("ont", 90, None), ("avez", 60, None)]),
    ("prime", [("premier", 120, None)]),
    ("commons", [("communes", 150, None)]),
    ("care", [("soins", 120, None)]),
    ("last", [("dernier", 110, None), ("dernière", 70, None), ("derniers", 35, None)]),
    ("same", [("même", 150, None), ("mêmes", 30, None)]),
    ("at", [("à", 190, None), ("au", 70, None)]),
    ("reform", [("réformiste", 120, None), ("réforme", 80, None)]),
    # ---- phrases
    (
        "the house",
        [
            ("la chambre", 180, None),
            ("la maison", 30, None),
            ("chambre", 12, "1-0"),
            ("la chambre des communes", 8, "0-0 1-1"),
        ],
    ),
    ("the parliament", [("le parlement", 150, None), ("la législature", 10, None), ("parlement", 15, "1-0")]),
    (
        "the government",
        [("le gouvernement", 390, None), ("gouvernement", 60, "1-0"), ("l&apos; administration", 8, None)],
    ),
    ("the minister", [("le ministre", 260, None), ("la ministre", 45, None), ("ministre", 30, "1-0")]),
    (
        "the member",
        [("le député", 170, None), ("la députée", 30, None), ("le membre", 15, None), ("député", 25, "1-0")],
    ),
    ("the members", [("les députés", 190, None), ("les membres", 60, None), ("députés", 15, "1-0")]),
    ("the country", [("le pays", 210, None), ("pays", 25, "1-0"), ("la nation", 12, None)]),
    (
        "the bill",
        [
            ("le projet de loi", 160, "0-0 1-1 1-2 1-3"),
            ("ce projet de loi", 25, "0-0 1-1 1-2 1-3"),
            ("la loi", 30, None),
        ],
    ),
    ("the question", [("la question", 210, None), ("question", 20, "1-0"), ("le problème", 9, None)]),
    ("the debate", [("le débat", 150, None), ("la discussion", 10, None), ("ce débat", 8, None)]),
    ("the committee", [("le comité", 190, None), ("du comité", 22, None), ("la commission", 18, None)]),
    (
        "mr. speaker",
        [
            ("monsieur le président", 290, "0-0 1-1 1-2"),
            ("m. le président", 40, "0-0 1-1 1-2"),
            ("madame la présidente", 20, "0-0 1-1 1-2"),
        ],
    ),
    (
        "i think",
        [
            ("je pense", 150, None),
            ("je crois", 70, None),
            ("j&apos; estime", 20, None),
            ("à mon avis", 12, "0-1 1-2"),
        ],
    ),
    (
        "i think that",
        [("je pense que", 110, None), ("je crois que", 50, None), ("j&apos; estime que", 15, None)],
    ),
    ("we must", [("nous devons", 160, None), ("il faut", 70, None), ("on doit", 20, None)]),
    ("we have", [("nous avons", 220, None), ("on a", 25, None), ("nous disposons", 10, None)]),
    ("we are", [("nous sommes", 200, None), ("on est", 20, None)]),
    (
        "in the",
        [
            ("dans le", 160, None),
            ("dans la", 140, None),
            ("au", 120, "0-0 1-0"),
            ("dans les", 90, None),
            ("en", 30, "0-0"),
        ],
    ),
    (
        "of the",
        [("du", 310, "0-0 1-0"), ("de la", 260, None), ("des", 240, "0-0 1-0"), ("de l&apos;", 110, None)],
    ),
    ("to the", [("au", 170, "0-0 1-0"), ("à la", 120, None), ("aux", 80, "0-0 1-0")]),
    ("on the", [("sur le", 130, None), ("sur la", 110, None), ("sur les", 70, None)]),
    ("for the", [("pour le", 110, None), ("pour la", 90, None), ("pour les", 70, None)]),
    ("it is", [("il est", 160, None), ("c&apos; est", 150, None), ("cela est", 15, None)]),
    ("it &apos;s", [("c&apos; est", 95, None), ("il est", 30, None)]),
    ("is not", [("n&apos; est pas", 140, "0-1 1-0 1-2"), ("n&apos; est", 25, "0-1 1-0")]),
    ("that is", [("c&apos; est", 100, None), ("qui est", 50, None), ("c&apos; est-à-dire", 20, None)]),
    (
        "this bill",
        [("ce projet de loi", 170, "0-0 1-1 1-2 1-3"), ("cette mesure", 20, None), ("cette loi", 15, None)],
    ),
    ("this government", [("ce gouvernement", 170, None), ("le gouvernement", 40, None)]),
    ("prime minister", [("premier ministre", 210, None)]),
    ("the prime minister", [("le premier ministre", 190, None), ("premier ministre", 25, "1-0 2-1")]),
    (
        "the minister of finance",
        [("le ministre des finances", 120, None), ("la ministre des finances", 8, None)],
    ),
    ("the minister of health", [("le ministre de la santé", 90, "0-0 1-1 2-2 3-4")]),
    (
        "the government of canada",
        [("le gouvernement du canada", 130, None), ("le gouvernement canadien", 40, "0-0 1-1 3-2")],
    ),
    ("the people", [("les gens", 90, None), ("la population", 80, None), ("le peuple", 40, None)]),
    (
        "the people of canada",
        [
            ("les canadiens", 40, "0-0 1-1 3-1"),
            ("la population du canada", 30, None),
            ("le peuple canadien", 25, "0-0 1-1 3-2"),
        ],
    ),
    (
        "the federal government",
        [("le gouvernement fédéral", 200, "0-0 1-2 2-1"), ("le fédéral", 20, "0-0 1-1")],
    ),
    ("the official opposition", [("l&apos; opposition officielle", 120, "0-0 1-2 2-1")]),
    (
        "the hon. member",
        [
            ("le député", 150, "0-0 2-1"),
            ("l&apos; honorable député", 60, None),
            ("la députée", 25, "0-0 2-1"),
        ],
    ),
    ("the hon. member for", [("le député de", 110, "0-0 2-1 3-2"), ("la députée de", 20, "0-0 2-1 3-2")]),
    (
        "the reform party",
        [("le parti réformiste", 140, "0-0 1-2 2-1"), ("les réformistes", 30, "0-0 1-1 2-1")],
    ),
    ("health care", [("soins de santé", 180, "0-2 1-0"), ("les soins de santé", 40, "0-3 1-1")]),
    (
        "job creation",
        [("création d&apos; emplois", 130, "0-2 1-0"), ("la création d&apos; emplois", 35, "0-3 1-1")],
    ),
    ("the budget", [("le budget", 220, None), ("ce budget", 25, None), ("budget", 20, "1-0")]),
    ("the economy", [("l&apos; économie", 180, None), ("économie", 20, "1-0")]),
    ("in canada", [("au canada", 250, None), ("du canada", 20, None)]),
    (
        "i would like",
        [
            ("je voudrais", 120, "0-0 1-1 2-1"),
            ("j&apos; aimerais", 70, "0-0 1-1 2-1"),
            ("je souhaite", 20, "0-0 1-1 2-1"),
        ],
    ),
    (
        "i would like to",
        [
            ("je voudrais", 80, "0-0 1-1 2-1"),
            ("j&apos; aimerais", 50, "0-0 1-1 2-1"),
            ("je tiens à", 30, "0-0 1-1 2-1 3-2"),
        ],
    ),
    ("we do not", [("nous ne", 90, "0-0 2-1"), ("nous n&apos;", 30, "0-0 2-1"), ("on ne", 15, "0-0 2-1")]),
    ("do not", [("ne", 120, "1-0"), ("pas", 60, "1-0"), ("n&apos;", 30, "1-0")]),
    ("don &apos;t", [("ne", 40, "1-0"), ("pas", 25, "1-0")]),
    (
        "the house of commons",
        [
            ("la chambre des communes", 200, None),
            ("les communes", 20, "0-0 3-1"),
            ("la chambre", 15, "0-0 1-1"),
        ],
    ),
    ("house of commons", [("chambre des communes", 150, None)]),
    (
        "thank you",
        [("merci", 160, "0-0 1-0"), ("je vous remercie", 60, "0-2 1-1"), ("je remercie", 15, "0-1")],
    ),
    ("the motion", [("la motion", 160, None), ("cette motion", 20, None)]),
    (
        "all canadians",
        [
            ("tous les canadiens", 170, "0-0 1-1 1-2"),
            ("l&apos; ensemble des canadiens", 30, "0-0 0-1 0-2 1-3"),
            ("tous les canadiens et canadiennes", 25, "0-0 1-1 1-2 1-4"),
        ],
    ),
    ("the provinces", [("les provinces", 190, None), ("des provinces", 20, None), ("provinces", 15, "1-0")]),
    ("our country", [("notre pays", 240, None), ("le pays", 20, None)]),
    (
        "unemployment insurance",
        [
            ("assurance-chômage", 150, "0-0 1-0"),
            ("l&apos; assurance-chômage", 60, "0-1 1-1"),
            ("régime d&apos; assurance-chômage", 25, "0-2 1-0 1-2"),
        ],
    ),
    ("the last", [("le dernier", 70, None), ("la dernière", 50, None), ("les derniers", 35, None)]),
    (
        "at the same time",
        [
            ("en même temps", 90, "0-0 2-1 3-2"),
            ("à la fois", 40, "0-0 1-1 3-2"),
            ("parallèlement", 15, "0-0 1-0 2-0 3-0"),
        ],
    ),
    ("first nations", [("premières nations", 110, None), ("autochtones", 15, "0-0 1-0")]),
    (
        "of course",
        [("bien sûr", 110, "1-0 1-1"), ("évidemment", 80, "0-0 1-0"), ("naturellement", 25, "1-0")],
    ),
    ("the tax", [("l&apos; impôt", 60, None), ("la taxe", 45, None)]),
    ("the vote", [("le vote", 90, None), ("le scrutin", 15, None)]),
    (
        "very important",
        [("très important", 130, None), ("très importante", 60, None), ("essentiel", 10, "0-0 1-0")],
    ),
    ("new jobs", [("nouveaux emplois", 60, "0-0 1-1"), ("emplois", 10, "1-0")]),
]


def parse_alignment(text: str | None, n_src: int, n_tgt: int) -> list[tuple[int, int]]:
    """Alignment points as ``(source index, target index)``, checked to lie inside both phrases."""
    if text is None:
        if n_src != n_tgt:
            raise ValueError(f"implicit one-to-one alignment needs equal lengths ({n_src} vs {n_tgt})")
        return [(i, i) for i in range(n_src)]
    points = []
    for item in text.split():
        s, t = (int(x) for x in item.split("-"))
        if not (0 <= s < n_src and 0 <= t < n_tgt):
            raise ValueError(f"alignment point {item} outside a {n_src}x{n_tgt} phrase pair")
        points.append((s, t))
    if not points:
        raise ValueError("a phrase pair needs at least one alignment point")
    return points


def lexical_weight(
    words: list[str],
    other: list[str],
    links: dict[int, list[int]],
    prob: dict[tuple[str, str], float],
) -> float:
    """Koehn-style lexical weight: product over ``words`` of the mean link probability (or NULL's)."""
    weight = 1.0
    for i, word in enumerate(words):
        linked = links.get(i)
        if linked:
            weight *= sum(prob[(word, other[j])] for j in linked) / len(linked)
        else:
            weight *= prob[(word, NULL)]
    return weight


Pair = tuple[list[str], list[str], list[tuple[int, int]], int]  # source, target, alignment, count


def build_pairs() -> list[Pair]:
    """Every phrase pair of ``LEXICON`` with its alignment points and count, checked."""
    pairs: list[Pair] = []
    seen: set[tuple[str, str]] = set()
    for source, targets in LEXICON:
        for target, count, alignment in targets:
            if (source, target) in seen:
                raise ValueError(f"duplicate pair {source!r} -> {target!r}")
            seen.add((source, target))
            src, tgt = source.split(), target.split()
            pairs.append((src, tgt, parse_alignment(alignment, len(src), len(tgt)), count))
    return pairs


def word_counts(pairs: list[Pair]) -> dict[tuple[str, str], float]:
    """c(source word, target word) over the aligned words of every pair, unaligned words to NULL."""
    joint: dict[tuple[str, str], float] = defaultdict(float)
    for src, tgt, points, count in pairs:
        aligned_s = {s for s, _ in points}
        aligned_t = {t for _, t in points}
        for s, t in points:
            joint[(src[s], tgt[t])] += count
        for i, word in enumerate(src):
            if i not in aligned_s:
                joint[(word, NULL)] += count
        for j, word in enumerate(tgt):
            if j not in aligned_t:
                joint[(NULL, word)] += count
    return joint


def build_lex_lines() -> tuple[list[bytes], list[bytes]]:
    """``lex.f2e`` and ``lex.e2f`` as ``train-model.perl`` step 4 writes them from the same counts.

    Moses' ``LexicalTranslationModel.pm`` writes ``e f w(e|f)`` to lex.f2e and ``f e w(f|e)`` to
    lex.e2f, f being the source language (here English), with ``%.7f`` and ``NULL`` for an
    unaligned word. They are what ``rescorer propose`` reads beside the table to give a proposed
    pair its lexical weights. Only the word pairs seen aligned are listed (no made-up NULL
    floor), in sorted order rather than Perl's hash order, so the files are reproducible.
    """
    joint = word_counts(build_pairs())
    total_s: dict[str, float] = defaultdict(float)
    total_t: dict[str, float] = defaultdict(float)
    for (s, t), c in joint.items():
        total_s[s] += c
        total_t[t] += c
    moses = {NULL: "NULL"}
    f2e, e2f = [], []
    for (s, t), c in sorted(joint.items()):
        f, e = moses.get(s, s), moses.get(t, t)
        f2e.append(f"{e} {f} {c / total_s[s]:.7f}".encode())
        e2f.append(f"{f} {e} {c / total_t[t]:.7f}".encode())
    return sorted(f2e), sorted(e2f)


def build_lines() -> list[bytes]:
    """The table's lines (without newline), sorted in C byte order."""
    rng = random.Random(SEED)
    pairs = build_pairs()

    # Word translation probabilities w(s|t) and w(t|s) from the aligned words of every pair.
    joint = word_counts(pairs)
    total_t: dict[str, float] = defaultdict(float)
    total_s: dict[str, float] = defaultdict(float)
    for (s, t), c in joint.items():
        total_t[t] += c
        total_s[s] += c
    p_s_given_t = {(s, t): c / total_t[t] for (s, t), c in joint.items()}
    p_t_given_s = {(t, s): c / total_s[s] for (s, t), c in joint.items()}
    # Every word needs a NULL probability in case it is unaligned somewhere: give it a small one.
    for s in total_s:
        p_s_given_t.setdefault((s, NULL), 1e-4)
    for t in total_t:
        p_t_given_s.setdefault((t, NULL), 1e-4)

    # Counts: c(s) adds pruned low-count targets; c(t) adds the target's other sources.
    target_total: dict[str, int] = defaultdict(int)
    for _src, tgt, _points, count in pairs:
        target_total[" ".join(tgt)] += count
    target_extra = {t: rng.randint(0, max(1, c // 3)) for t, c in sorted(target_total.items())}
    source_total: dict[str, int] = defaultdict(int)
    for src, _tgt, _points, count in pairs:
        source_total[" ".join(src)] += count
    source_extra = {s: rng.randint(0, max(1, c // 5)) for s, c in sorted(source_total.items())}

    lines: list[bytes] = []
    for src, tgt, points, count in pairs:
        source, target = " ".join(src), " ".join(tgt)
        c_src = source_total[source] + source_extra[source]
        c_tgt = target_total[target] + target_extra[target]
        s_links: dict[int, list[int]] = defaultdict(list)
        t_links: dict[int, list[int]] = defaultdict(list)
        for s, t in points:
            s_links[s].append(t)
            t_links[t].append(s)
        scores = [
            count / c_tgt,
            lexical_weight(src, tgt, s_links, p_s_given_t),
            count / c_src,
            lexical_weight(tgt, src, t_links, p_t_given_s),
        ]
        alignment = " ".join(f"{s}-{t}" for s, t in sorted(points, key=lambda p: (p[1], p[0])))
        fields = [
            source,
            target,
            " ".join(f"{v:.6g}" for v in scores),
            alignment,
            f"{c_tgt} {c_src} {count}",
        ]
        lines.append((" ||| ".join(fields) + " ||| |||").encode("utf-8"))
    return sorted(lines)


def main() -> None:
    lines = build_lines()
    with open(OUT, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        gz.write(b"".join(line + b"\n" for line in lines))
    print(f"wrote {len(lines)} lines to {OUT}")
    for name, lex in zip(("lex.f2e", "lex.e2f"), build_lex_lines(), strict=True):
        (OUT.parent / name).write_bytes(b"".join(line + b"\n" for line in lex))
        print(f"wrote {len(lex)} lines to {OUT.parent / name}")


if __name__ == "__main__":
    main()
