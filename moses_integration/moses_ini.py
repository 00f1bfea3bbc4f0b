"""Parse and edit a Moses ``moses.ini``, keeping every byte we do not deliberately change.

A moses.ini is hand-edited, commented and diffed by people, and tools such as ``mert-moses.pl``
rewrite parts of it, so an editor that re-serialises the whole file would destroy comments,
ordering and sections it does not understand. Here the file is held as its raw lines grouped by
section; reading interprets them the way Moses does, and an edit replaces only the text of the one
value it changes (a single ``key=value`` token or a single weight line).

How Moses reads the file (``Parameter::ReadConfigFile``), mirrored here:

* everything from the first ``#`` on a line is a comment, then the line is trimmed;
* a line starting with ``[`` opens the section named up to the first ``]``;
* other non-empty lines are values of the current section.

``[feature]`` values are ``Type key=value ...`` (split on blanks, each argument at its first
``=``). A feature without ``name=`` is named after its type plus a per-type counter over the
unnamed ones: the first unnamed ``WordPenalty`` is ``WordPenalty0``. ``[weight]`` values are
``Name= w1 w2 ...``.

A feature added here gets a dense weight line, so its name must be a dense name for Moses' tuning
tools: ``extractor`` reads any name containing ``_`` as a sparse feature (SPEC §6), so names
are a letter followed by letters or digits (:func:`dense_feature_name_problem`, also the rule of
``mert``'s extra n-best features).
"""

from __future__ import annotations

import glob
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from infrastructure.errors import UserError
from infrastructure.files import atomic_output

PathArg = str | os.PathLike[str]

FEATURE_SECTION = "feature"
WEIGHT_SECTION = "weight"

#: Feature types whose default (no ``tuneable=``) is untuneable in Moses: not in n-best lists,
#: not tuned by MERT, but still counted in the total score.
DEFAULT_UNTUNEABLE_TYPES: frozenset[str] = frozenset({"UnknownWordPenalty"})

_BLANKS = re.compile(r"(\s+)")
_TRUE = frozenset({"yes", "y", "true", "1"})
_FALSE = frozenset({"no", "n", "false", "0"})
_DENSE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*")


class MosesIniError(UserError):
    """A moses.ini that Moses would reject or misread, located by file and (if known) 1-based line."""

    def __init__(self, path: PathArg, line_no: int | None, reason: str) -> None:
        self.path = os.fspath(path)
        self.line_no = line_no
        self.reason = reason
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.line_no is None:
            return f"{self.path}: {self.reason}"
        return f"{self.path}:{self.line_no}: {self.reason}"

    def __reduce__(self) -> tuple[type[MosesIniError], tuple[str, int | None, str]]:
        return (type(self), (self.path, self.line_no, self.reason))


@dataclass
class IniSection:
    """One ``[name]`` block as raw text: its header line and the lines up to the next header.

    ``name`` is None (and ``header`` None) for the lines before the first header, so comments at
    the top of the file survive like everything else. Lines keep their own ``\\n`` / ``\\r\\n``.
    """

    name: str | None
    header: str | None
    lines: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FeatureLine:
    """One ``[feature]`` value as Moses interprets it.

    ``args`` holds every ``key=value`` in file order (``name`` and ``num-features`` included);
    ``name`` is the explicit ``name=`` or Moses' default ``Type<k>``.
    """

    type: str
    args: dict[str, str]
    name: str
    line_no: int

    @property
    def explicit_name(self) -> bool:
        return "name" in self.args

    @property
    def num_features(self) -> int | None:
        value = self.args.get("num-features")
        return None if value is None else int(value)

    @property
    def path(self) -> str | None:
        return self.args.get("path")

    @property
    def tuneable(self) -> bool:
        """Moses' ``tuneable=`` (yes/y/true/1 or no/n/false/0), defaulting per feature type."""
        value = self.args.get("tuneable")
        if value is None:
            return self.type not in DEFAULT_UNTUNEABLE_TYPES
        return value.lower() in _TRUE

    @property
    def is_phrase_table(self) -> bool:
        """PhraseDictionaryMemory/Compact/OnDisk/... and the probing table (``ProbingPT``)."""
        return self.type.startswith("PhraseDictionary") or self.type == "ProbingPT"


def format_weight(value: float) -> str:
    """Shortest text that reads back as exactly ``value`` (``1`` rather than ``1.0``).

    Exactness matters because MERT compares weights to 1e-5 between iterations and a lossy
    write would make a resumed tuning run differ from an uninterrupted one.
    """
    if not math.isfinite(value):
        raise ValueError(f"weight {value!r} is not finite")
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def _split_lines(text: str) -> list[str]:
    """Lines with their ``\\n`` kept; only ``\\n`` splits, as with Moses' getline."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _content(raw: str) -> str:
    """What Moses sees of a raw line: up to the first ``#``, trimmed."""
    return raw.split("#", 1)[0].strip()


def _body_span(raw: str) -> tuple[int, int]:
    """Start and end of the content of ``raw`` (before the comment, without edge blanks)."""
    uncommented = raw.split("#", 1)[0]
    start = len(uncommented) - len(uncommented.lstrip())
    end = len(uncommented.rstrip())
    return start, max(start, end)


def _replace_body(raw: str, new_body: str) -> str:
    """``raw`` with its content replaced, keeping indentation, trailing blanks, comment and newline."""
    start, end = _body_span(raw)
    return raw[:start] + new_body + raw[end:]


def _check_token(path: str, line_no: int | None, what: str, value: str) -> None:
    """Moses splits on blanks and cuts at ``#``: a value with either would be silently mangled."""
    if not value or any(ch.isspace() for ch in value) or "#" in value:
        raise MosesIniError(path, line_no, f"{what} {value!r} must be non-empty, without blanks or '#'")


def _check_feature_arg(path: str, line_no: int | None, key: str, value: str) -> None:
    """A ``key=value`` token Moses reads back as exactly this key and value."""
    _check_token(path, line_no, "feature argument key", key)
    if "=" in key:
        raise MosesIniError(path, line_no, f"feature argument key {key!r} contains '='")
    _check_token(path, line_no, f"value of {key}=", value)


def dense_feature_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a dense feature for Moses and MERT, or None when it can.

    The rule is a letter followed by letters or digits: no ``_`` (Moses' ``extractor`` reads such a
    name as a sparse feature), no blanks, ``=`` or ``#`` (they would split or cut the ini line).
    """
    if _DENSE_NAME.fullmatch(name):
        return None
    if "_" in name:
        return "contains '_', which Moses' extractor reads as a sparse feature"
    return "must be a letter followed by letters or digits"


class MosesIni:
    """A moses.ini as editable raw sections; ``text()`` of an unedited file equals the input."""

    def __init__(self, sections: list[IniSection], path: PathArg = "<string>") -> None:
        self.sections = sections
        self.path = os.fspath(path)

    # ---- reading and writing ------------------------------------------------------------

    @classmethod
    def parse(cls, text: str, path: PathArg = "<string>") -> MosesIni:
        """Group ``text`` into sections; raises for a ``[`` line without ``]``."""
        name = os.fspath(path)
        sections = [IniSection(None, None)]
        for line_no, raw in enumerate(_split_lines(text), start=1):
            content = _content(raw)
            if content.startswith("["):
                close = content.find("]")
                if close < 0:
                    raise MosesIniError(name, line_no, f"section header {content!r} has no ']'")
                sections.append(IniSection(content[1:close], raw))
            else:
                sections[-1].lines.append(raw)
        return cls(sections, name)

    @classmethod
    def read(cls, path: PathArg) -> MosesIni:
        with open(path, "rb") as fh:
            data = fh.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line_no = data.count(b"\n", 0, exc.start) + 1
            raise MosesIniError(path, line_no, "not valid UTF-8") from exc
        return cls.parse(text, path)

    def text(self) -> str:
        parts: list[str] = []
        for section in self.sections:
            if section.header is not None:
                parts.append(section.header)
            parts.extend(section.lines)
        return "".join(parts)

    def write(self, path: PathArg) -> None:
        """Write atomically, so an interrupted edit never leaves Moses a half-written config."""
        with atomic_output(path) as fh:
            fh.write(self.text().encode("utf-8"))

    # ---- generic section access -----------------------------------------------------------

    def _iter_values(self, section_name: str) -> Iterator[tuple[IniSection, int, int, str]]:
        """``(section, index in section.lines, 1-based line number, content)`` of each value."""
        line_no = 0
        for section in self.sections:
            if section.header is not None:
                line_no += 1
            for index, raw in enumerate(section.lines):
                line_no += 1
                if section.name != section_name:
                    continue
                content = _content(raw)
                if content:
                    yield section, index, line_no, content

    # ---- features -------------------------------------------------------------------------

    def _parse_feature(self, content: str, line_no: int, counters: dict[str, int]) -> FeatureLine:
        tokens = content.split()
        args: dict[str, str] = {}
        for token in tokens[1:]:
            key, eq, value = token.partition("=")
            if not eq:
                raise MosesIniError(self.path, line_no, f"feature argument {token!r} is not key=value")
            if key in args:
                raise MosesIniError(self.path, line_no, f"duplicate key {key!r} in feature line")
            args[key] = value
        feature_type = tokens[0]
        if "name" in args:
            name = args["name"]
        else:
            index = counters.get(feature_type, 0)
            counters[feature_type] = index + 1
            name = f"{feature_type}{index}"
        if "num-features" in args:
            try:
                if int(args["num-features"]) < 0:
                    raise ValueError
            except ValueError:
                raise MosesIniError(
                    self.path, line_no, f"num-features={args['num-features']!r} is not a count"
                ) from None
        value = args.get("tuneable")
        if value is not None and value.lower() not in _TRUE | _FALSE:
            raise MosesIniError(self.path, line_no, f"tuneable={value!r} is not a boolean")
        return FeatureLine(feature_type, args, name, line_no)

    def _features_with_position(self) -> list[tuple[FeatureLine, IniSection, int]]:
        counters: dict[str, int] = {}
        found: list[tuple[FeatureLine, IniSection, int]] = []
        seen: dict[str, int] = {}
        for section, index, line_no, content in self._iter_values(FEATURE_SECTION):
            feature = self._parse_feature(content, line_no, counters)
            if feature.name in seen:
                raise MosesIniError(
                    self.path,
                    line_no,
                    f"feature name {feature.name!r} already used on line {seen[feature.name]}",
                )
            seen[feature.name] = line_no
            found.append((feature, section, index))
        return found

    def feature_lines(self) -> list[FeatureLine]:
        """All ``[feature]`` entries in file order (the order Moses creates them in)."""
        return [feature for feature, _, _ in self._features_with_position()]

    def find_feature(self, name: str) -> FeatureLine | None:
        return next((f for f in self.feature_lines() if f.name == name), None)

    def phrase_tables(self) -> list[FeatureLine]:
        return [f for f in self.feature_lines() if f.is_phrase_table]

    def model_files(self, cwd: str | os.PathLike | None = None) -> list[Path]:
        """The files the features read (their ``path=``), resolved as Moses resolves them: against ``cwd``
        (the decoder's working folder; the ini's own by default). Moses adds suffixes to some paths
        (``.gz``, ``.minphr``, ``.minlexr``, ``.binphr.*``), so a path stands for every file of its folder
        whose name starts with it; a folder (a probing table) for every file in it. A path that finds
        nothing is left out: Moses itself says it is missing when it loads."""
        base = Path(cwd) if cwd is not None else Path(self.path).parent
        files: set[Path] = set()
        for feature in self.feature_lines():
            if feature.path is None:
                continue
            path = base / feature.path  # an absolute path stays as it is
            if path.is_dir():
                files.update(p for p in path.rglob("*") if p.is_file())
            elif path.parent.is_dir():
                files.update(p for p in path.parent.glob(glob.escape(path.name) + "*") if p.is_file())
        return sorted(files)

    def choose_phrase_table(self, table_name: str | None, *, how_to_name: str = "name one") -> FeatureLine:
        """The phrase table ``table_name`` names, or the only one; an error lists the phrase tables.

        ``how_to_name`` ends the error when there are several and none is named: how the caller's
        user names one (``rescore-phrase-table``: its ``--table NAME``).
        """
        tables = self.phrase_tables()
        names = ", ".join(t.name for t in tables) or "none"
        if table_name is not None:
            feature = self.find_feature(table_name)
            if feature is None:
                raise MosesIniError(self.path, None,
                                    f"no phrase table named {table_name!r}; its phrase tables: {names}")
            if not feature.is_phrase_table:
                raise MosesIniError(self.path, feature.line_no, f"{table_name} is a {feature.type}, not a phrase "
                                                                f"table; its phrase tables: {names}")
            return feature
        if len(tables) != 1:
            raise MosesIniError(self.path, None,
                                f"expected exactly one phrase table, found {len(tables)} ({names}): {how_to_name}")
        return tables[0]

    def absolutize_paths(self, base: str | os.PathLike[str]) -> MosesIni:
        """Make every relative ``path=`` in ``[feature]`` absolute against ``base``; returns self.

        Moses resolves model paths against its *working directory*, so a copy of a relocatable
        config written elsewhere would point nowhere once moved; absolute paths make the copy
        usable from any directory.
        """
        for feature in self.feature_lines():
            path = feature.path
            if path and not os.path.isabs(path):
                self.set_feature_arg(feature.name, "path", os.path.abspath(os.path.join(base, path)))
        return self

    def set_feature_arg(self, name: str, key: str, value: str) -> FeatureLine:
        """Set ``key=value`` on feature ``name``: replace that token in place, or append it.

        Only the one token changes, so spacing, trailing blanks and an end-of-line comment stay.
        """
        for feature, section, index in self._features_with_position():
            if feature.name != name:
                continue
            _check_feature_arg(self.path, feature.line_no, key, value)
            raw = section.lines[index]
            start, end = _body_span(raw)
            pieces = _BLANKS.split(raw[start:end])  # tokens at even indices, blanks at odd
            for i in range(2, len(pieces), 2):
                if pieces[i].partition("=")[0] == key:
                    pieces[i] = f"{key}={value}"
                    break
            else:
                pieces.extend([" ", f"{key}={value}"])
            section.lines[index] = _replace_body(raw, "".join(pieces))
            return self._require_feature(name)
        raise MosesIniError(self.path, None, f"no feature named {name!r} in [feature]")

    def _require_feature(self, name: str) -> FeatureLine:
        feature = self.find_feature(name)
        if feature is None:
            raise MosesIniError(self.path, None, f"no feature named {name!r} in [feature]")
        return feature

    def add_feature(self, feature_line: str, weights: Sequence[float]) -> FeatureLine:
        """Append ``feature_line`` (``Type key=value ...``) to ``[feature]`` and ``Name= w ...`` to ``[weight]``.

        The feature line goes after the last ``[feature]`` value, the weight line after the last
        ``[weight]`` line (a ``[weight]`` section is opened when there is none), each ending as
        the line above it does. Its name is ``name=`` or Moses' default ``Type<k>``; it must be a
        dense name (:func:`dense_feature_name_problem`) not used by another feature or weight line;
        the line must read back as written (no ``#``, no line break, every argument
        ``key=value``), and ``num-features=``, when given, must equal the number of weights.
        Everything is checked before anything changes, so a failed call leaves the config as it was.
        """
        existing = self._features_with_position()
        if not any(s.name == FEATURE_SECTION for s in self.sections):
            raise MosesIniError(self.path, None, f"no [feature] section to add {feature_line!r} to")
        body = feature_line.strip()
        if not body or "#" in body or "\n" in body or "\r" in body:
            raise MosesIniError(self.path, None, f"feature line {feature_line!r} must be one line without '#'")
        counters: dict[str, int] = {}
        for feature, _, _ in existing:
            if not feature.explicit_name:
                counters[feature.type] = counters.get(feature.type, 0) + 1
        try:  # each argument key=value, num-features= and tuneable= checked as on reading
            new = self._parse_feature(body, 0, counters)
            for key, value in new.args.items():
                _check_feature_arg(self.path, 0, key, value)
        except MosesIniError as exc:
            raise MosesIniError(self.path, None, f"feature line {body!r}: {exc.reason}") from None
        problem = dense_feature_name_problem(new.name)
        if problem:
            raise MosesIniError(self.path, None, f"feature name {new.name!r} {problem}")
        taken = next((f for f, _, _ in existing if f.name == new.name), None)
        if taken is not None:
            raise MosesIniError(self.path, taken.line_no, f"feature name {new.name!r} is already used by this "
                                f"{taken.type}; choose another name")
        current = self._weights_with_position()
        if new.name in current:
            raise MosesIniError(self.path, current[new.name][3], f"a weight line for {new.name} exists, but no "
                                "feature of that name")
        if not weights:
            raise MosesIniError(self.path, None, f"no weights given for {new.name}")
        if new.num_features is not None and new.num_features != len(weights):
            raise MosesIniError(self.path, None, f"{new.name} has num-features={new.num_features} but "
                                f"{len(weights)} weights")
        text = " ".join(format_weight(v) for v in weights)  # validates before any edit
        if existing:
            _, section, index = existing[-1]
        else:
            section = [s for s in self.sections if s.name == FEATURE_SECTION][-1]
            index = max((i for i, raw in enumerate(section.lines) if raw.strip()), default=-1)
        self._insert_line(section, index + 1, body)
        self._insert_weight_line(f"{new.name}= {text}", current)
        return self._require_feature(new.name)

    def _insert_line(self, section: IniSection, index: int, body: str) -> None:
        """Insert the value ``body`` at ``section.lines[index]``, ending it as the line before it ends.

        A CRLF file gets a CRLF line, and a last line without a newline gets one first, so the new
        value never joins the line above it.
        """
        newline = self._newline()
        previous = section.lines[index - 1] if index > 0 else section.header
        if previous is not None and not previous.endswith("\n"):
            if index > 0:
                section.lines[index - 1] += newline
            else:
                section.header = previous + newline
        section.lines.insert(index, body + newline)

    def _newline(self) -> str:
        """The file's line ending: that of its first line (``\n`` for a file of one line)."""
        first, newline, _ = self.text().partition("\n")
        return "\r\n" if newline and first.endswith("\r") else "\n"

    # ---- weights --------------------------------------------------------------------------

    def _weights_with_position(self) -> dict[str, tuple[list[float], IniSection, int, int]]:
        found: dict[str, tuple[list[float], IniSection, int, int]] = {}
        for section, index, line_no, content in self._iter_values(WEIGHT_SECTION):
            tokens = content.split()
            if len(tokens) < 2 or not tokens[0].endswith("=") or len(tokens[0]) < 2:
                raise MosesIniError(self.path, line_no, f"weight line {content!r} is not 'Name= w1 w2 ...'")
            name = tokens[0][:-1]
            try:
                values = [float(tok) for tok in tokens[1:]]
            except ValueError:
                raise MosesIniError(self.path, line_no, f"weight line for {name} has a non-number") from None
            if not all(math.isfinite(v) for v in values):
                raise MosesIniError(self.path, line_no, f"weight line for {name} has a non-finite value")
            if name in found:
                raise MosesIniError(
                    self.path, line_no, f"weights for {name} already given on line {found[name][3]}"
                )
            found[name] = (values, section, index, line_no)
        return found

    def weights(self) -> dict[str, list[float]]:
        """Feature name -> weights, in ``[weight]`` order."""
        return {name: item[0] for name, item in self._weights_with_position().items()}

    def set_weights(self, name: str, values: Sequence[float]) -> None:
        """Replace (or add) the weight line of ``name``; the line's comment and blanks are kept."""
        if not values:
            raise ValueError(f"no weights given for {name}")
        text = " ".join(format_weight(v) for v in values)
        _check_token(self.path, None, "feature name", name)
        current = self._weights_with_position()
        if name in current:
            _, section, index, _ = current[name]
            section.lines[index] = _replace_body(section.lines[index], f"{name}= {text}")
            return
        self._insert_weight_line(f"{name}= {text}", current)

    def _insert_weight_line(
        self, body: str, current: dict[str, tuple[list[float], IniSection, int, int]]
    ) -> None:
        """Put a new weight line after the last existing one, or open a ``[weight]`` section."""
        if current:
            _, section, index, _ = list(current.values())[-1]
            self._insert_line(section, index + 1, body)
            return
        weight_sections = [s for s in self.sections if s.name == WEIGHT_SECTION]
        if weight_sections:
            section = weight_sections[-1]
            last = max((i for i, raw in enumerate(section.lines) if raw.strip()), default=-1)
            self._insert_line(section, last + 1, body)
            return
        self._ensure_final_newline()
        newline = self._newline()
        self.sections.append(IniSection(WEIGHT_SECTION, "[weight]" + newline, [body + newline]))

    def _ensure_final_newline(self) -> None:
        newline = self._newline()
        for section in reversed(self.sections):
            if section.lines:
                if not section.lines[-1].endswith("\n"):
                    section.lines[-1] += newline
                return
            if section.header is not None:
                if not section.header.endswith("\n"):
                    section.header += newline
                return

    # ---- the edit the rescorer needs --------------------------------------------------------

    def add_phrase_table_scores(
        self,
        new_path: PathArg | None,
        new_weights: Sequence[float],
        table_name: str | None = None,
    ) -> FeatureLine:
        """Point a phrase table at ``new_path`` and declare/weight ``len(new_weights)`` more columns.

        This is the edit that must accompany appending score columns to a table (SPEC §3): a
        num-features/column or num-features/weight mismatch is the most common way a Moses
        tuning run fails. ``table_name`` may be omitted when the config has exactly one phrase
        table. Everything is checked before anything changes, so a failed call leaves the config
        as it was. A compact table (``.minphr``) does not store its column count: rebinarise it
        with ``processPhraseTableMin -nscores`` matching the new ``num-features``.
        """
        table = self.choose_phrase_table(table_name)
        if table.num_features is None:
            raise MosesIniError(self.path, table.line_no, f"{table.name} has no num-features=")
        current = self._weights_with_position()
        if table.name not in current:
            raise MosesIniError(self.path, None, f"no [weight] line for {table.name}")
        old_values, section, index, line_no = current[table.name]
        if len(old_values) != table.num_features:
            raise MosesIniError(
                self.path,
                line_no,
                f"{table.name} has num-features={table.num_features} but {len(old_values)} weights "
                "(Moses: 'Mismatch in number of features and number of weights')",
            )
        appended = " ".join(format_weight(v) for v in new_weights)  # validates before any edit
        path_text = None if new_path is None else os.fspath(new_path)
        if path_text is not None:
            _check_token(self.path, table.line_no, "phrase-table path", path_text)
            self.set_feature_arg(table.name, "path", path_text)
        self.set_feature_arg(table.name, "num-features", str(table.num_features + len(new_weights)))
        if appended:
            raw = section.lines[index]
            _, end = _body_span(raw)
            section.lines[index] = raw[:end] + " " + appended + raw[end:]
        updated = self._require_feature(table.name)
        if updated.num_features != len(self.weights()[table.name]):  # the invariant Moses checks
            raise MosesIniError(self.path, line_no, f"{table.name}: num-features and weights disagree")
        return updated
