"""The moses.ini side of rescoring: checked before any work, rewritten after it.

A wrong ``num-features``, a binarised table or the wrong one of several tables is something Moses
finds when it loads the new table, after hours of training and scoring. Everything Moses will
check is checked here first, in seconds (:func:`check_moses_ini`); :func:`write_moses_ini` then
makes the edit that goes with the two appended columns (SPEC §3).

The written ini may also get the CSLM as Moses' in-decoder ``NeuralLM`` feature (``--cslm``): the
order Moses must be given is the model file's own ``ngram_size``, and a wrong one is refused by
Moses only when it loads the model, minutes into a run, so it is read from the file here.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from infrastructure.files import display_name
from moses_integration.moses_ini import FeatureLine, MosesIni, MosesIniError
from moses_integration.nplm import neural_lm_feature_line
from moses_integration.phrase_table import read_phrase_table
from rescorer.pipeline.errors import RescoreError

TEXT_TABLE_TYPES = ("PhraseDictionaryMemory", "PhraseDictionaryMultiModel")
DEFAULT_CSLM_NAME = "CSLM0"


#: How a user of rescore-phrase-table names the phrase table of a moses.ini with several.
CHOOSE_TABLE = "choose the one to rescore with --table NAME"


def _check_loadable_type(ini_path: str, table: FeatureLine, table_path: str, new_columns: int) -> None:
    if table.type not in TEXT_TABLE_TYPES and not table_path.endswith(".minphr"):
        raise MosesIniError(
            ini_path, table.line_no,
            f"{table.name} is a {table.type}, which cannot load the text table {table_path}; binarise it first, e.g. "
            f"processPhraseTableMin -in {table_path} -out table -nscores {(table.num_features or 0) + new_columns}, "
            f"or change the feature to PhraseDictionaryMemory",
        )


def first_line_columns(table_path: str) -> int | None:
    """Score columns on the table's first line (checked as Moses reads it); None for stdin or empty."""
    if table_path == "-":
        return None
    with contextlib.closing(read_phrase_table(table_path)) as entries:
        first = next(entries, None)
    return None if first is None else len(first.scores)


def add_cslm(ini: MosesIni, cslm: str, name: str = DEFAULT_CSLM_NAME, weight: float = 0.0) -> FeatureLine:
    """Add ``NeuralLM factor=0 name=NAME order=N path=/abs/cslm`` and ``NAME= weight`` to ``ini``.

    ``N`` is the model file's ``ngram_size`` (Moses refuses any other order, but only once it has
    loaded the model); the header is read and checked as NeuralLM will use it, so a missing,
    truncated or foreign file fails now with its path. The name must be a new dense name.
    """
    if cslm == "-":
        raise MosesIniError(ini.path, None, "the --cslm model must be a file Moses can open, not stdin")
    return ini.add_feature(neural_lm_feature_line(cslm, name), [weight])


def ini_table_path(table_path: str) -> str:
    """The path of the new table as the written moses.ini names it: absolute (``-`` as is)."""
    return table_path if table_path == "-" else str(Path(table_path).resolve())


def check_table_path_for_ini(table_path: str, ini_out: str | None) -> None:
    """Refuse an output table whose path a moses.ini line cannot hold: Moses splits the line at blanks
    and cuts it at ``#``, so the written ini would name another file. Found before any work (naming the
    option that asks for the ini), not after the training and the scoring."""
    written = ini_table_path(table_path)
    if any(ch.isspace() for ch in written) or "#" in written:
        raise RescoreError(f"the output table {written!r} holds a blank or '#', which the moses.ini of "
                           f"--moses-ini-out {ini_out} cannot hold (Moses splits its lines at blanks and cuts them at "
                           "'#'): choose a path without them")


def check_moses_ini(
    ini_in: str,
    input_table: str,
    output_table: str,
    *,
    ini_out: str | None = None,
    table_name: str | None = None,
    new_columns: int = 2,
    cslm: str | None = None,
    cslm_name: str = DEFAULT_CSLM_NAME,
    cslm_weight: float = 0.0,
) -> int:
    """Everything Moses will check about the new table, checked now; returns its ``num-features``.

    The returned count is what every line of ``input_table`` must have; the scorer enforces it
    line by line. With ``cslm``, the NPLM model file, feature name and weight are checked too
    (:func:`add_cslm`). Nothing is written.
    """
    check_table_path_for_ini(output_table, ini_out)
    ini = MosesIni.read(ini_in)
    table = ini.choose_phrase_table(table_name, how_to_name=CHOOSE_TABLE)
    _check_loadable_type(ini.path, table, output_table, new_columns)
    # A dry run of the edit itself: num-features present and equal to the number of weights.
    ini.add_phrase_table_scores(None, [0.0] * new_columns, table.name)
    if cslm is not None:
        add_cslm(ini, cslm, cslm_name, cslm_weight)
    assert table.num_features is not None  # add_phrase_table_scores refuses a table without it
    columns = first_line_columns(input_table)
    if columns is not None and columns != table.num_features:
        raise MosesIniError(
            ini.path, table.line_no,
            f"{table.name} has num-features={table.num_features}, but {display_name(input_table)}:1 has {columns} "
            f"scores; Moses would refuse the rescored table (fix num-features and its weights, or pick the table "
            f"with --table NAME)",
        )
    if ini_out is not None and not Path(ini_out).resolve().parent.is_dir():
        raise MosesIniError(ini_out, None, f"the folder of --moses-ini-out {ini_out} does not exist")
    return table.num_features


def write_moses_ini(
    ini_in: str,
    ini_out: str,
    table_path: str,
    weights: tuple[float, ...],
    table_name: str | None = None,
    *,
    cslm: str | None = None,
    cslm_name: str = DEFAULT_CSLM_NAME,
    cslm_weight: float = 0.0,
) -> FeatureLine | None:
    """A moses.ini whose phrase table is ``table_path``, with ``len(weights)`` more features.

    With ``cslm``, the model is added as Moses' in-decoder ``NeuralLM`` feature ``cslm_name``
    with weight ``cslm_weight`` (:func:`add_cslm`); that feature line is returned.

    Paths are written absolute (the other models' relative paths resolved against the input ini's
    folder) because Moses resolves relative paths against its working directory, which is rarely
    the folder of the new ini. A binarised table (compact, on-disk) cannot read the text output;
    the error says which command rebuilds it with the right score count.
    """
    ini = MosesIni.read(ini_in)
    table = ini.choose_phrase_table(table_name, how_to_name=CHOOSE_TABLE)
    _check_loadable_type(ini.path, table, table_path, len(weights))
    new_path = ini_table_path(table_path)
    # Relocatable systems keep relative model paths, valid when Moses runs in the ini's folder;
    # the new ini lives elsewhere, so its other models are pinned to where they are now.
    ini.absolutize_paths(Path(ini_in).resolve().parent)
    ini.add_phrase_table_scores(new_path, weights, table.name)
    added = None if cslm is None else add_cslm(ini, cslm, cslm_name, cslm_weight)
    ini.write(ini_out)
    return added
