"""Table 1 work folders for the pipeline's tests: a SCALE=small folder, text files, and the
moses.ini files and tuning runs the steps leave behind (without running Moses)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from table1 import workspace
from table1.settings import RunPlan

#: The + RNN system's moses.ini (a 6-column table: p_RNN and WP last), as rescore-phrase-table writes it.
SIX_COLUMN_INI = """[input-factors]
0
[mapping]
0 T 0
[distortion-limit]
6
[feature]
UnknownWordPenalty
WordPenalty
PhrasePenalty
PhraseDictionaryMemory name=TranslationModel0 num-features=6 path={table} input-factor=0 output-factor=0
Distortion
KENLM name=LM0 factor=0 path=/x/lm.bin order=4
[weight]
UnknownWordPenalty0= 1
WordPenalty0= -1
PhrasePenalty0= 0.2
TranslationModel0= 0.2 0.2 0.2 0.2 {rnn} {wp}
Distortion0= 0.3
LM0= 0.5
"""


def load_experiment(work: Path, scale: str, **kwargs: object) -> workspace.Experiment:
    """The experiment in ``work`` at ``scale`` with its work folder opened (settings recorded or checked),
    ready for any step, as ``table1``'s command opens it before running steps."""
    exp = workspace.new_experiment(work, scale, **kwargs)
    workspace.open_work(exp)
    return exp


def small_experiment(tmp_path: Path, **kw) -> workspace.Experiment:
    """A SCALE=small work folder under ``tmp_path``."""
    return load_experiment(tmp_path / "work", "small", **kw)


def write_lines(path: Path, lines: list[str], gz: bool = False) -> None:
    """``lines`` as a text file (gzipped with ``gz``), its folder made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(f"{line}\n" for line in lines).encode()
    if gz:
        with gzip.open(path, "wb") as fh:
            fh.write(data)
    else:
        path.write_bytes(data)


def six_column_ini(exp: workspace.Experiment, rnn: str, wp: str) -> str:
    """:data:`SIX_COLUMN_INI` with the p_RNN and WP start weights ``rnn`` and ``wp``."""
    return SIX_COLUMN_INI.format(rnn=rnn, wp=wp, table=exp.rnn_ini.parent / "phrase-table.rnn.gz")


def write_rnn_system(exp: workspace.Experiment, rnn: str = "0", wp: str = "0") -> None:
    """The + RNN system's moses.ini where the rnn step leaves it."""
    exp.rnn_ini.parent.mkdir(parents=True, exist_ok=True)
    exp.rnn_ini.write_text(six_column_ini(exp, rnn, wp))


def write_tuned_run(exp: workspace.Experiment, plan: RunPlan, seed: int, finished: str) -> None:
    """A finished tuning run as the pipeline leaves it: state, final ini and stamp."""
    work = exp.tune_dir(plan)
    work.mkdir(parents=True, exist_ok=True)
    (work / "tuning-state.json").write_text(json.dumps({"format": "mert-tune-state/1", "fingerprint": {"seed": seed}}))
    (work / "moses.ini").write_text(six_column_ini(exp, "0", "0"))
    exp.stamp_path(f"tune/{plan.name}").write_text(json.dumps({"step": f"tune/{plan.name}", "finished": finished}))
