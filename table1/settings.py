"""The Table 1 experiment's settings and configurations, all in one readable place.

``SCALE=small`` is what runs on a 2-core machine in a few hours of CPU per step, on Hansard with a
news test set; ``SCALE=small-news`` is the same size on text selected for the news domain (a
domain check); ``SCALE=medium`` is the news-domain setup large enough to tell the
paper's gains from noise, in about 15 hours of the same machine (the time plan printed before the
first tuning run shows the arithmetic from measured decoding speeds); ``SCALE=full`` is the paper's
setup for a GPU machine (docs/table1.md). Everything that differs between
scales is a field of :class:`ScaleSettings`; nothing else in the pipeline depends on the scale.

The four configurations of SPEC §5 share one 6-column phrase table (the four Moses scores, then
p_RNN and the unknown-word column). A column that is not part of a configuration keeps weight 0
and is held there by the optimizer (``mert tune --fixed``), so Baseline decodes exactly as the
4-column system. The CSLM rows run the CSLM inside Moses' search, as the paper did: trained
self-normalised, exported to NPLM's format and loaded by Moses' ``NeuralLM`` feature. The same
rows with the CSLM as an n-best rescoring feature instead (``cslm-nbest-*``) are there to compare
the two ways; they run only when named in ``CONFIGS``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

from infrastructure.errors import UserError


@dataclass(frozen=True)
class TextSlice:
    """Lines ``first..last`` (1-based, inclusive; ``last`` None: to the end) of ``DATA/path``.

    ``path`` names the source-language file with ``{lang}`` where the language code goes.
    """

    path: str
    first: int = 1
    last: int | None = None


@dataclass(frozen=True)
class RnnSettings:
    """The RNN Encoder-Decoder (``rescorer train``) sizes and budget."""

    hidden: int
    embedding: int
    maxout_units: int
    output_rank: int
    shortlist: int
    max_time: float  # seconds of training
    patience: int = 10
    # updates of training as well, where set: a budget a loaded machine cannot shrink (the tests' tiny runs)
    max_steps: int | None = None
    init_std: float = 0.01  # SPEC §1's N(0, 0.01²); see SMALL for why the small scale departs from it


@dataclass(frozen=True)
class CslmSettings:
    """The CSLM (``cslm train``) sizes and budget."""

    embedding: int
    hidden: tuple[int, ...]  # one or two layers: what NPLM (Moses' NeuralLM) can hold
    shortlist: int
    max_time: float
    # alpha of --self-normalize: Moses' NeuralLM adds raw scores, which are log-probabilities only
    # as far as log Z is near 0 (Devlin et al. 2014 used 0.1).
    self_normalize: float = 0.1
    # --epoch-size: n-grams between validations (each "epoch" a fresh random sample, the CSLM
    # toolkit's resampling). None: one validation per pass over the LM text, which at SMALL's
    # 1,900 n-grams/s is once an hour, so the best model of the budget is never looked for; news
    # perplexity swings by ±4% between validations 500k n-grams apart (docs/cslm.md, "CSLM quality").
    epoch_size: int | None = None
    # --max-epochs: a budget in epochs as well as max_time; whichever comes first stops training.
    max_epochs: int | None = None


@dataclass(frozen=True)
class ProposalSettings:
    """``rescorer propose`` for the proposals rows: what the RNN proposes, for which sources.

    ``rescorer propose``'s defaults (docs/proposals.md): the sources of the dev+test text that the
    filtered table lacks or holds fewer than ``thin_below`` targets for, the best ``per_source``
    new targets of a beam of ``beam``.
    """

    beam: int = 10
    per_source: int = 5
    thin_below: int = 3


@dataclass(frozen=True)
class RerankChoiceSettings:
    """``rescorer rerank-weights`` for the ``proposals-both`` row: the dev text and the (λ, μ) grid its
    rerank weights are chosen on, the grid ``rescorer propose``'s defaults were chosen on
    (docs/proposals.md); 50 sentences of dev are about 3,000 sources to fill, a few minutes on 2 cores."""

    sentences: int | None = 50  # dev's first sentences (None: all)
    reverse: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 1.5)  # λ
    length: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0)  # μ


@dataclass(frozen=True)
class NmtSettings:
    """The attention encoder-decoder (``nmt train``) of one direction: sizes and budget."""

    embedding: int = 256
    hidden: int = 256
    alignment: int = 256
    maxout: int = 256
    vocab_size: int = 8000  # sentencepiece units per side
    max_time: float = 6 * 3600  # seconds of training, per direction
    valid_lines: int = 1000


@dataclass(frozen=True)
class RerankingSettings:
    """Reranking Baseline's tuned runs: each run decodes dev and test once, with its tuned weights, into
    ``nbest_size``-best distinct lists (Moses' segmentation included, for the phrase-level scores);
    each network's score is added as a feature, the weights are tuned on the fixed dev lists by
    ``mert optimize`` (``restarts`` random restarts) and test is reranked with them.

    The models the lists are scored with beyond those Table 1 trains (the RNN, its reverse, the
    CSLM): the attention NMT model in both directions (``nmt``), and a phrase RNN of the paper's
    sizes (``big_rnn``) trained on the same table, read out at the hours in ``big_rnn_readouts``.
    """

    nbest_size: int = 1000
    # The hypotheses of each list that are scored and reranked: its first rerank_size (Moses writes
    # them best first). The oracle BLEU of every size up to nbest_size is reported, so what a deeper
    # list could gain is measured, not guessed; scoring costs grow with it (the NMT model scores about
    # 100 hypotheses a second per thread on the development machine).
    rerank_size: int = 1000
    restarts: int = 20
    nmt: NmtSettings = NmtSettings()
    big_rnn: RnnSettings = RnnSettings(hidden=1000, embedding=100, maxout_units=500, output_rank=100,
                                       shortlist=15_000, max_time=12 * 3600, init_std=0.01)
    big_rnn_readouts: tuple[float, ...] = (6.0, 12.0, 24.0)  # hours of training
    changed_examples: int = 10  # test sentences whose 1-best the best set changed, chosen by position


@dataclass(frozen=True)
class SelectionBudget:
    """The paper's data selection (Moore & Lewis; Axelrod et al. for the bitext), scored against
    in-domain text: the dev set, newstest2012+2013, as the paper did, plus the scale's in-domain
    parallel text (``ScaleSettings.train_in_domain``) where it has one. How many target words are
    kept of each text."""

    train_words: int  # of the cleaned general parallel text (``train``), counted on the target side
    lm_words: int | None  # of the LM text; None: the LM text is kept whole
    order: int = 4  # n-gram order of the selection models
    min_count: int = 2  # in-domain words seen fewer times are <oov> to both models


@dataclass(frozen=True)
class ScaleSettings:
    """Everything that differs between the scales (``SCALE=small``, ``medium``, ``full``)."""

    name: str
    train: list[TextSlice]  # parallel training text (source and target of each slice)
    lm: list[TextSlice]  # target-language LM text ({lang} is the target language)
    lm_valid: TextSlice  # held-out target text for the CSLM's early stopping (not dev, not test)
    dev: list[TextSlice]  # tuning set (concatenated)
    test: TextSlice
    max_sentence_words: int  # clean-corpus-n MAX
    lm_order: int
    lm_prune: tuple[int, ...]
    lm_memory: str  # lmplz -S
    rnn: RnnSettings
    cslm: CslmSettings
    tune_max_iterations: int
    nbest_size: int = 100
    restarts: int = 20
    src_lang: str = "en"
    tgt_lang: str = "fr"
    selection: SelectionBudget | None = None  # None: train on all of the training and LM text
    # Wall hours the whole experiment is planned in: the time plan printed before the first tuning
    # run says which optional rows (OPTIONAL_ROWS) fit beside the chosen ones. None: no plan.
    plan_hours: float | None = None
    # In-domain parallel text, added whole to the (selected) training text; where the scale selects,
    # also part of the in-domain text the selection scores against. Never tuned or tested on.
    train_in_domain: tuple[TextSlice, ...] = ()
    proposals: ProposalSettings = ProposalSettings()
    rerank: RerankChoiceSettings = RerankChoiceSettings()  # the proposals-both row's rerank weights, chosen on dev
    reranking: RerankingSettings = RerankingSettings()  # the reranking experiment (table1.reranking)

    def __post_init__(self) -> None:
        if self.train_in_domain and self.selection is None:
            raise ValueError(f"scale {self.name}: train_in_domain is added to selected text; give selection=")

    def to_json(self) -> dict[str, object]:
        return asdict(self)


#: The earlier WMT news test sets (7,567 pairs): in-domain parallel text for the news-domain scales.
#: None of them is tuned or tested on; newstest2011 stays the CSLM's held-out text (``lm_valid``).
NEWS_PARALLEL: tuple[TextSlice, ...] = (
    TextSlice("newstest/news-test2008.{lang}"),
    TextSlice("newstest/newssyscomb2009.{lang}"),
    TextSlice("newstest/newstest2009.{lang}"),
    TextSlice("newstest/newstest2010.{lang}"),
)

#: The whole Hansard bitext (947,969 pairs), the pool the news-domain scales select from.
HANSARD = TextSlice("hansard/hansard.{lang}.gz")

SMALL = ScaleSettings(
    name="small",
    # The fixture's corpus: the first 40,000 Hansard pairs; its LM text: 300,000 French lines.
    train=[TextSlice("hansard/hansard.{lang}.gz", 1, 40_000)],
    lm=[TextSlice("hansard/hansard.{lang}.gz", 1, 300_000)],
    lm_valid=TextSlice("newstest/newstest2011.{lang}", 1, 1000),
    # 400 tuning sentences from the paper's tuning sets; 1,000 sentences of the paper's test set.
    dev=[TextSlice("newstest/newstest2012.{lang}", 1, 200), TextSlice("newstest/newstest2013.{lang}", 1, 200)],
    test=TextSlice("newstest/newstest2014.{lang}", 1, 1000),
    max_sentence_words=80,
    lm_order=4,
    lm_prune=(0, 0, 1),
    lm_memory="1G",
    # benchmarks/score_speed.py's 'small' size: d = 256 scores ~7,000 pairs/s on 2 cores (README
    # performance table); one hour of training (wall time: on a shared machine it gets less), so that
    # the 6 tuning runs and their decodes fit in the same session on 2 cores.
    # init_std 0.1, not the paper's 0.01: with 0.01 a d = 256 model trained for minutes to hours on
    # a CPU ignores the source (validation source gain ~0 nats/pair; the encoder's gradients start
    # near 1e-8, far below Adadelta's sqrt(eps) = 1e-3, so its weights barely move), and the +RNN
    # column would measure a target-phrase LM, not the paper's model. With 0.1 the same model and
    # budget reach a source gain of ~4 nats/pair (docs/train.md, "Does the model use the source?").
    rnn=RnnSettings(hidden=256, embedding=64, maxout_units=128, output_rank=64, shortlist=15_000, max_time=3600,
                    init_std=0.1),
    # One hidden layer of 512, not the paper's two: inside Moses the second layer's matrix-vector
    # product is a lookup's main cost (NPLM premultiplies the first into the embeddings at load), so
    # dropping it decodes 4.6x faster (4.9x against 22.7x the plain system's time per sentence;
    # benchmarks/cslm_decoder_speed.py, README performance table), which makes the in-decoder rows'
    # six tuning runs fit in a few hours instead of about ten. Held-out perplexity after the same
    # 250k n-grams: 252.8 with one layer, 260.1 with 512 and 256 (docs/moses-nplm.md).
    # Validated every million n-grams: about every 9 minutes on 2 cores, six times in the hour;
    # one validation on the 26k newstest2011 tokens takes about 4 s on 1 thread.
    cslm=CslmSettings(embedding=128, hidden=(512,), shortlist=15_000, max_time=3600, epoch_size=1_000_000),
    tune_max_iterations=10,
)

#: The news-domain recipe at SMALL's size (the domain check): Baseline here against SMALL's
#: separates what the domain does from what the scale does. Everything but the text is SMALL's.
SMALL_NEWS = dataclasses.replace(
    SMALL,
    name="small-news",
    # The Hansard pairs most like news (bilingual Moore-Lewis, see MEDIUM), to SMALL's size: 800k French
    # words, what SMALL's 40,000 pairs hold after tokenisation (801,199), plus the news sets whole.
    train=[HANSARD],
    train_in_domain=NEWS_PARALLEL,
    # SMALL's LM text (the first 300,000 French Hansard lines) plus the news sets' French side.
    lm=[TextSlice("hansard/hansard.{lang}.gz", 1, 300_000), *NEWS_PARALLEL],
    selection=SelectionBudget(train_words=800_000, lm_words=None),
)

MEDIUM = ScaleSettings(
    name="medium",
    # A setup large enough, and in the test's domain, to tell a +0.5 BLEU column from noise
    # (SCALE=small's 400 dev and 1,000 test sentences leave ±0.2 BLEU of sampling noise, and its
    # Hansard-only table lacks most of the news' words, which no rescoring of the table can fix).
    # Training text, as the paper built its own: the Hansard pairs most like news by Axelrod et al.'s
    # bilingual Moore-Lewis selection, scored against the dev set and the news sets, to 6M French
    # words (about 300,000 pairs at Hansard's 20 tokens a line: 7.5x SMALL, a Moses system of a few
    # hours on 2 cores), plus the 7,567 pairs of the earlier news test sets, whole.
    train=[HANSARD],
    train_in_domain=NEWS_PARALLEL,
    # The LM on all 948k French Hansard lines (which hold the selected training side) and the news
    # sets' French side: an n-gram LM gains from more text even out of domain, and KenLM's 5-gram
    # model of 20M words takes minutes. Not selected (lm_words=None).
    lm=[HANSARD, *NEWS_PARALLEL],
    lm_valid=TextSlice("newstest/newstest2011.{lang}", 1, 1000),
    # 1,000 tuning sentences from the paper's tuning sets; the paper's whole test set (3,003).
    dev=[TextSlice("newstest/newstest2012.{lang}", 1, 500), TextSlice("newstest/newstest2013.{lang}", 1, 500)],
    test=TextSlice("newstest/newstest2014.{lang}"),
    max_sentence_words=80,
    lm_order=5,
    lm_prune=(0, 0, 1),
    lm_memory="2G",
    # SMALL's RNN (d = 256 with init_std 0.1, see SMALL) for four hours: about 750 pairs/s on this
    # 2-core machine in fp32 (README performance table), ~10M pairs, about one pass over the table's
    # unique pairs. A larger model would see a fraction of them in the same time.
    rnn=RnnSettings(hidden=256, embedding=64, maxout_units=128, output_rank=64, shortlist=15_000, max_time=4 * 3600,
                    init_std=0.1),
    # SMALL's one-layer CSLM on 3x the text, 2 hours; trained only for the optional CSLM (n-best) row.
    cslm=CslmSettings(embedding=128, hidden=(512,), shortlist=15_000, max_time=2 * 3600, epoch_size=1_000_000),
    # The paper's MERT: 100-best, 20 restarts, up to 25 iterations (mert-moses.pl's default cap). The
    # report marks every run that stopped at the cap rather than converging.
    tune_max_iterations=25,
    selection=SelectionBudget(train_words=6_000_000, lm_words=None),
    # 300-best distinct lists, of which the first 100 (the tuning's n-best size) are scored and reranked:
    # the NMT model's two directions then take about 2.3 hours for 3 runs' dev and test on 2 cores, not
    # 23. Moses' distinct n-best extraction grows much faster than the list: on this system, 0.65, 1.06,
    # 1.87 and 9.8 s a sentence for 100, 300, 500 and 1000-best (docs/table1.md), so 3.5 CPU hours for
    # the six lists at 300 against 33 at 1000. The oracle curve to 300 shows what a deeper list adds.
    reranking=RerankingSettings(nbest_size=300, rerank_size=100),
    # A run of 12-15 hours on a 2-core machine, which --resume lets one interrupt and continue.
    plan_hours=15.0,
)

FULL = ScaleSettings(
    name="full",
    # DATA/train.{en,fr}.gz: the WMT'14 en-fr parallel data; DATA/lm.fr.gz: news monolingual
    # French plus the French side (docs/table1.md lists the sources). The prepare step then selects what
    # the paper kept: 348M of the 850M parallel words, 418M of the 2G LM words (French words).
    train=[TextSlice("train.{lang}.gz")],
    lm=[TextSlice("lm.{lang}.gz")],
    lm_valid=TextSlice("newstest/newstest2011.{lang}"),
    dev=[TextSlice("newstest/newstest2012.{lang}"), TextSlice("newstest/newstest2013.{lang}")],
    test=TextSlice("newstest/newstest2014.{lang}"),
    max_sentence_words=80,
    lm_order=5,
    lm_prune=(0, 0, 1),
    lm_memory="50%",
    # The paper's sizes (SPEC §1, §5); budgets are upper bounds, early stopping usually ends first.
    rnn=RnnSettings(hidden=1000, embedding=100, maxout_units=500, output_rank=100, shortlist=15_000,
                    max_time=3 * 24 * 3600),
    cslm=CslmSettings(embedding=512, hidden=(1536, 1024), shortlist=15_000, max_time=3 * 24 * 3600),
    tune_max_iterations=25,
    selection=SelectionBudget(train_words=348_000_000, lm_words=418_000_000),
)

SCALES: dict[str, ScaleSettings] = {s.name: s for s in (SMALL, SMALL_NEWS, MEDIUM, FULL)}


@dataclass(frozen=True)
class Configuration:
    """One row of Table 1: which of the new columns and features it tunes."""

    key: str  # used in file names and CONFIGS=
    label: str  # as in the paper
    rnn: bool
    cslm: bool
    wp: bool
    paper_dev: float | None  # None: a row the paper does not have
    paper_test: float | None
    cslm_in_decoder: bool = True  # False: the CSLM rescores n-best lists (an extra MERT feature)
    # True: the row decodes with the table that ``rescorer propose`` completed (the proposals step),
    # whose 7th column is the indicator of a proposed pair; its weight is tuned.
    proposals: bool = False
    compare_with: tuple[str, ...] = ()  # keys of other rows its Δ is also reported against
    # True: the row's table carries p_RNN(f|e) too (``rescore-phrase-table --reverse-model``), the
    # 7th column, after U; its weight is tuned.
    reverse: bool = False
    # The reranking's models (labels of table1.reranking_models.reranking_feature_specs) the row adds as
    # n-best features inside the tuning loop (``mert tune --feature``), each tuned.
    nbest_features: tuple[str, ...] = ()

    def appended_labels(self) -> list[str]:
        """The report's names of the columns the row's table has after Moses' four, in order: p_RNN
        and U (WP), then the reverse p_RNN(f|e) where the row has it, and P with proposals."""
        return ["p_RNN", "WP"] + ["p_RNN(f|e)"] * self.reverse + ["proposed (indicator)"] * self.proposals

    def appended_columns(self) -> int:
        """How many columns the row's table has after Moses' four."""
        return len(self.appended_labels())

    @property
    def table_system(self) -> str:
        """The system whose phrase table the row decodes with, named as its folder and stamp in the
        work folder: ``rnn`` (6 columns), ``rnn-both`` (+ p_RNN(f|e)), ``proposals`` (+ the
        indicator) or ``proposals-both`` (both: proposals reranked by both directions)."""
        if self.proposals:
            return "proposals-both" if self.reverse else "proposals"
        return "rnn-both" if self.reverse else "rnn"

    @property
    def decoded_system(self) -> str:
        """The system the row tunes and decodes with (``speed/NAME`` measures it): its table system,
        or ``cslm``, that system's 6-column table with the CSLM in the search."""
        return "cslm" if self.cslm_in_search else self.table_system

    def fixed_columns(self, table_feature: str, num_scores: int) -> list[str]:
        """The n-best columns held at weight 0: the RNN column and/or the unknown-word column.

        The appended columns follow Moses' four in ``rescore-phrase-table``'s order (p_RNN, U, and
        p_RNN(f|e) with a reverse model), then ``rescorer propose``'s indicator: a row always tunes
        the reverse column and the indicator where its table has them.
        """
        first = num_scores - self.appended_columns()
        rnn_col, wp_col = f"{table_feature}_{first}", f"{table_feature}_{first + 1}"
        return ([] if self.rnn else [rnn_col]) + ([] if self.wp else [wp_col])

    @property
    def cslm_in_search(self) -> bool:
        """The row runs the CSLM inside Moses' search (its tuned system has the NeuralLM feature)."""
        return self.cslm and self.cslm_in_decoder

    @property
    def cslm_nbest(self) -> bool:
        """The row rescores n-best lists with the CSLM (rather than running it in the decoder)."""
        return self.cslm and not self.cslm_in_decoder

    @property
    def nbest_rescored(self) -> bool:
        """The row's output is chosen by rescoring Moses' n-best list, not Moses' own 1-best."""
        return self.cslm_nbest or bool(self.nbest_features)

    def feature_specs(self, cslm_model: str) -> list[str]:
        """``mert tune --feature`` values: the CSLM as an n-best feature where the row has it so."""
        return [f"CSLM:{cslm_model}"] if self.cslm_nbest else []


CONFIGURATIONS: list[Configuration] = [
    Configuration("baseline", "Baseline", rnn=False, cslm=False, wp=False, paper_dev=30.64, paper_test=33.30),
    Configuration("rnn", "+ RNN", rnn=True, cslm=False, wp=False, paper_dev=31.20, paper_test=33.87),
    Configuration("cslm-rnn", "+ CSLM + RNN", rnn=True, cslm=True, wp=False, paper_dev=31.48, paper_test=34.64),
    Configuration("cslm-rnn-wp", "+ CSLM + RNN + WP", rnn=True, cslm=True, wp=True, paper_dev=31.50,
                  paper_test=34.54),
]
#: The CSLM rows with n-best rescoring instead of the decoder, to compare the two (not in the paper).
NBEST_CONFIGURATIONS: list[Configuration] = [
    Configuration("cslm-nbest-rnn", "+ CSLM (n-best) + RNN", rnn=True, cslm=True, wp=False, paper_dev=31.48,
                  paper_test=34.64, cslm_in_decoder=False),
    Configuration("cslm-nbest-rnn-wp", "+ CSLM (n-best) + RNN + WP", rnn=True, cslm=True, wp=True, paper_dev=31.50,
                  paper_test=34.54, cslm_in_decoder=False),
]
#: Rows not in the paper (its conclusion names them as the next step): + RNN with the
#: table completed by the RNN's proposals for the dev+test text's missing and thin sources.
PROPOSAL_CONFIGURATIONS: list[Configuration] = [
    Configuration("rnn-proposals", "+ RNN + proposals", rnn=True, cslm=False, wp=False, paper_dev=None,
                  paper_test=None, proposals=True, compare_with=("rnn",)),
]
#: The row for the unknown-word column alone (the paper has it only beside the CSLM): + RNN with
#: the WP column tuned too. Not in the paper.
WP_CONFIGURATIONS: list[Configuration] = [
    Configuration("rnn-wp", "+ RNN + WP", rnn=True, cslm=False, wp=True, paper_dev=None, paper_test=None,
                  compare_with=("rnn",)),
]
#: Rows not in the paper: + RNN with the RNN in both directions, p(e|f) and p(f|e) (a
#: reverse model's column), as the table carries its own two phrase probabilities; both tuned.
#: With proposals: the table completed by proposals reranked by both directions
#: (``rescorer propose --reverse-model``), carrying p_RNN(f|e) too.
REVERSE_CONFIGURATIONS: list[Configuration] = [
    Configuration("rnn-both", "+ RNN both directions", rnn=True, cslm=False, wp=False, paper_dev=None,
                  paper_test=None, reverse=True, compare_with=("rnn",)),
    Configuration("rnn-both-prop", "+ RNN both directions + proposals", rnn=True, cslm=False, wp=False,
                  paper_dev=None, paper_test=None, reverse=True, proposals=True, compare_with=("rnn", "rnn-both")),
]
#: The attention NMT model as an n-best feature inside the tuning loop, p(e|f) alone or both directions: the
#: rows the reranking experiment tunes for real when its reranking gain holds (docs/table1.md). Not in the paper.
NMT_CONFIGURATIONS: list[Configuration] = [
    Configuration("nmt-nbest", "+ NMT p(e|f) (n-best)", rnn=False, cslm=False, wp=False, paper_dev=None,
                  paper_test=None, nbest_features=("NMT p(e|f)",)),
    Configuration("nmt-both-nbest", "+ NMT p(e|f)+p(f|e) (n-best)", rnn=False, cslm=False, wp=False,
                  paper_dev=None, paper_test=None, nbest_features=("NMT p(e|f)+p(f|e)",)),
]
#: Every row, in table order: a row's columns only grow down the table.
ALL_CONFIGURATIONS = (CONFIGURATIONS[:2] + WP_CONFIGURATIONS + CONFIGURATIONS[2:] + NBEST_CONFIGURATIONS
                      + PROPOSAL_CONFIGURATIONS + REVERSE_CONFIGURATIONS + NMT_CONFIGURATIONS)
CONFIGURATIONS_BY_KEY = {c.key: c for c in ALL_CONFIGURATIONS}


#: The rows added to medium's required Baseline and + RNN where the time plan allows, in order.
OPTIONAL_ROWS = ("rnn-wp", "cslm-nbest-rnn-wp")


def select_configurations(keys: str | list[str] | None) -> list[Configuration]:
    """The configurations named, in table order (the paper's four when none): a list of names (``table1
    --config``, one name each), or one string of them separated by spaces or commas (``CONFIGS=``)."""
    if isinstance(keys, str):
        keys = keys.replace(",", " ").split()
    if not keys:
        return list(CONFIGURATIONS)
    unknown = [k for k in keys if k not in CONFIGURATIONS_BY_KEY]
    if unknown:
        several = any(" " in k or "," in k for k in unknown)
        raise UserError(f"unknown configuration(s) {', '.join(unknown)} (have {', '.join(CONFIGURATIONS_BY_KEY)})"
                        + ("; give one name per --config" if several else ""))
    return [c for c in ALL_CONFIGURATIONS if c.key in keys]


#: Run 1's seed. Run k's is ``RUN_SEED_BASE + k - 1``; ``MAX_RUNS`` keeps them apart modulo
#: ``mert tune``'s iteration stride (1000), so no two (run, iteration) pairs share restart points.
RUN_SEED_BASE = 1000
MAX_RUNS = 999


@dataclass(frozen=True)
class RunPlan:
    """Run ``k`` (1-based) of a configuration: its MERT seed and folder names."""

    config: Configuration
    run: int

    @property
    def seed(self) -> int:
        """``mert tune --seed``: 1000, 1001, 1002, ...

        ``mert tune`` seeds iteration ``n`` with ``seed + 1000 n`` (Moses' predictable seeds), so
        run seeds must differ modulo 1000: with seeds 1000 k, run 2's iteration n drew run 1's
        iteration n + 1 restart points. Run ``k`` of every configuration uses the same seed, so
        configurations differ only in their columns.
        """
        if not 1 <= self.run <= MAX_RUNS:
            raise UserError(f"run {self.run}: runs are numbered 1..{MAX_RUNS}")
        return RUN_SEED_BASE + self.run - 1

    @property
    def name(self) -> str:
        return f"{self.config.key}/run{self.run}"
