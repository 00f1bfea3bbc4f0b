# make install | test | lint | demo | bench | tune | table1 | image | image-check | clean. Every target sets up .venv
# itself; the Makefile only calls commands (the work is in the packages and their CLIs).
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint demo bench tune tune-moses table1 table1-moses image image-check clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n auto --dist worksteal

lint: install
	$(BIN)/ruff check .

# The main job on the built-in sample: train a small model on the sample table's own
# unique pairs within a short budget, then append the two RNN columns. Each run starts afresh
# (a training never overwrites a model it finds, so the last demo's outputs go first).
# --init-std 0.1: with the paper's 0.01 a model this small and this short ignores the source
# (source gain 0.000 nats/pair, docs/train.md "Does the model use the source?").
demo: install
	rm -rf demo-out
	mkdir -p demo-out
	$(BIN)/rescore-phrase-table examples/phrase-table.en-fr.gz demo-out/phrase-table.rnn.gz \
		--moses-ini examples/moses.ini --moses-ini-out demo-out/moses.ini \
		--train-steps 300 --hidden 64 --embedding 32 --maxout-units 32 --output-rank 32 --init-std 0.1
	@echo "--- first lines of demo-out/phrase-table.rnn.gz:"
	@$(BIN)/python -c "import gzip,itertools,sys; sys.stdout.writelines(l.decode() for l in itertools.islice(gzip.open('demo-out/phrase-table.rnn.gz'),5))"

# Every benchmark that runs without arguments (benchmarks/cslm_perplexity.py needs two trained
# models); the decoder one only with MOSES_BIN_DIR. Figures go to README's performance table.
bench: install
	$(BIN)/python -m benchmarks.train_speed
	$(BIN)/python -m benchmarks.score_speed
	$(BIN)/python -m benchmarks.precision
	$(BIN)/python -m benchmarks.pipeline_speed
	$(BIN)/python -m benchmarks.mert_speed
	$(BIN)/python -m benchmarks.cslm_speed
	$(if $(MOSES_BIN_DIR),MOSES_BIN_DIR=$(MOSES_BIN_DIR) $(BIN)/python -m benchmarks.cslm_decoder_speed)

# The experiment on a real Moses system (needs MOSES_BIN_DIR): append the RNN scores to the
# system's phrase table (path read from its moses.ini), tune all weights with `mert tune`, then
# score the test set with `mert evaluate`. The defaults are the fixture system in ../shared:
#   make tune MOSES_BIN_DIR=/path/to/moses/bin
#   make tune SYSTEM=dir DEV_SRC=… DEV_REF=… TEST_SRC=… TEST_REF=… [TEST_TOK_REF=…] [RNN_MODEL=model.pt]
# Without RNN_MODEL a model is trained on the table first (TRAIN_TIME seconds). RESCORE_ARGS and
# TUNE_ARGS pass extra options to rescore-phrase-table and mert tune (e.g. TUNE_ARGS=--resume).
# SYSTEM is the folder of moses.ini; its relative model paths are relative to it (Moses runs there).
SHARED ?= ../shared
FIXTURE ?= $(SHARED)/fixtures/hansard-enfr
SYSTEM ?= $(FIXTURE)/filtered
SYSTEM_INI ?= $(SYSTEM)/moses.ini
DEV_SRC ?= $(FIXTURE)/data/dev.tok.tc.en
DEV_REF ?= $(FIXTURE)/data/dev.tok.tc.fr
TEST_SRC ?= $(FIXTURE)/data/test.tok.tc.en
TEST_REF ?= $(FIXTURE)/data/test.fr
TEST_TOK_REF ?= $(FIXTURE)/data/test.tok.tc.fr
TARGET_LANG ?= fr
TUNE_OUT ?= tune-out
RNN_MODEL ?=
TRAIN_TIME ?= 1800
THREADS ?= 2
RESCORE_ARGS ?=
TUNE_ARGS ?=

# Moses is checked before anything is installed or computed; the message says where to get it.
GETTING_MOSES := to get Moses, see docs/moses-nplm.md (build it) or docker/README.md (an image with it)

tune-moses:
	@test -n "$(MOSES_BIN_DIR)" || { echo "make tune needs MOSES_BIN_DIR=<folder with the moses binary>; $(GETTING_MOSES)" >&2; exit 1; }
	@test -x "$(MOSES_BIN_DIR)/moses" || { echo "no executable moses in MOSES_BIN_DIR=$(MOSES_BIN_DIR); $(GETTING_MOSES)" >&2; exit 1; }

tune: tune-moses install
	mkdir -p $(TUNE_OUT)
	table=$$($(BIN)/python -c 'import os, sys; from moses_integration.moses_ini import MosesIni; \
		t = MosesIni.read(sys.argv[1]).phrase_tables(); \
		sys.exit("need exactly one phrase table in " + sys.argv[1]) if len(t) != 1 else \
		print(os.path.join(sys.argv[2], t[0].path))' $(SYSTEM_INI) $(SYSTEM)) && \
	$(BIN)/rescore-phrase-table "$$table" $(TUNE_OUT)/phrase-table.rnn.gz \
		--moses-ini $(SYSTEM_INI) --moses-ini-out $(TUNE_OUT)/moses.rnn.ini \
		$(if $(RNN_MODEL),--model $(RNN_MODEL),--train-time $(TRAIN_TIME)) $(RESCORE_ARGS)
	MOSES_BIN_DIR=$(MOSES_BIN_DIR) $(BIN)/mert tune --moses-ini $(TUNE_OUT)/moses.rnn.ini --decoder-cwd $(SYSTEM) \
		--src $(DEV_SRC) --ref $(DEV_REF) --work-dir $(TUNE_OUT)/tuning --threads $(THREADS) $(TUNE_ARGS)
	MOSES_BIN_DIR=$(MOSES_BIN_DIR) $(BIN)/mert evaluate --moses-ini $(TUNE_OUT)/tuning/moses.ini --src $(TEST_SRC) \
		--ref $(TEST_REF) $(if $(TEST_TOK_REF),--tok-ref $(TEST_TOK_REF)) --lang $(TARGET_LANG) \
		--output-dir $(TUNE_OUT)/eval --threads $(THREADS) --report $(TUNE_OUT)/eval/report.json

# The Table 1 experiment (docs/table1.md): raw text to the four tuned systems and
# results/table1.{md,json,png}, through `table1 all` (its steps, in order: table1/experiment.py's
# STEPS). It checks the Moses tools the steps still to run need before the first step writes anything,
# and says where to get Moses. Every step skips what is done, so `make table1` may be rerun after an interruption;
# STEPS='tune eval' runs only those. The settings of each SCALE (small, small-news, medium, full) are in
# table1/settings.py.
#   make table1 SCALE=small MOSES_BIN_DIR=/path/to/moses/bin MOSES_HOME=/path/to/moses [WORK=…] [RUNS=3]
# CONFIGS picks configurations (baseline rnn cslm-rnn cslm-rnn-wp; default all; also rnn-wp, cslm-nbest-rnn,
# cslm-nbest-rnn-wp, rnn-proposals, rnn-both and rnn-both-prop, which are not in the paper: docs/table1.md);
# ALIGNER=eflomal
# aligns with eflomal where Moses has no GIZA++/mgiza (auto picks).
SCALE ?= small
WORK ?= ../table1-work
DATA ?= $(if $(filter full,$(SCALE)),$(WORK)/wmt14,$(SHARED)/data)
MOSES_HOME ?=
DEVICE ?= auto
RUNS ?= 3
CONFIGS ?=
comma := ,
# table1 takes one --config per configuration: CONFIGS='baseline rnn' (or baseline,rnn) becomes
# --config baseline --config rnn.
CONFIG_OPTIONS = $(foreach config,$(subst $(comma), ,$(CONFIGS)),--config $(config))
ALIGNER ?= auto
RESULTS ?= results
# Other runs' table1.json to put beside this run's rows in its report: BESIDE='results/table1.json …'.
BESIDE ?=
STEPS ?= all

$(VENV)/.installed-experiment: $(STAMP)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[experiment]'
	touch $@

# A Moses path given is checked before the experiment extra installs (eflomal compiles for minutes), as
# table1 finds Moses (table1/system_training.py, MosesInstall.locate): the binaries in MOSES_BIN_DIR or
# MOSES_HOME/bin, the scripts in MOSES_HOME/scripts or beside MOSES_BIN_DIR. Which tools the steps still
# to run need, table1 checks itself before its first step; with no Moses path, steps that need none run.
MOSES_BINARIES = $(or $(MOSES_BIN_DIR),$(if $(MOSES_HOME),$(MOSES_HOME)/bin))
MOSES_SCRIPTS = $(if $(MOSES_HOME),$(MOSES_HOME)/scripts,$(if $(MOSES_BIN_DIR),$(MOSES_BIN_DIR)/../scripts))
table1-moses:
	@test -z "$(MOSES_BINARIES)" || test -d "$(MOSES_BINARIES)" || { echo "no Moses binaries folder at $(MOSES_BINARIES) (MOSES_BIN_DIR, or MOSES_HOME/bin); $(GETTING_MOSES)" >&2; exit 1; }
	@test -z "$(MOSES_SCRIPTS)" || test -d "$(MOSES_SCRIPTS)" || { echo "no Moses scripts/ folder at $(MOSES_SCRIPTS) (set MOSES_HOME to the Moses tree); $(GETTING_MOSES)" >&2; exit 1; }

table1: table1-moses $(VENV)/.installed-experiment
	$(BIN)/table1 $(STEPS) --work $(WORK) --scale $(SCALE) --data $(DATA) \
		$(if $(MOSES_BIN_DIR),--moses-bin-dir $(MOSES_BIN_DIR)) $(if $(MOSES_HOME),--moses-home $(MOSES_HOME)) \
		--threads $(THREADS) --device $(DEVICE) --runs $(RUNS) $(CONFIG_OPTIONS) --aligner $(ALIGNER) \
		--results $(RESULTS) $(foreach report,$(BESIDE),--beside $(report)) $(if $(MIRROR),--mirror $(MIRROR))

# The Docker image (docker/README.md), with podman or docker: IMAGE_ARGS passes docker/build-local.sh's
# options (local base and Moses images, --pip-cert, --wheels, --torch-index). image builds and tags
# rnn-rescorer; image-check builds and tags the same image, then its check stage (tagged
# rnn-rescorer-check), which runs make test and make tune inside it on the fixture system of ../shared
# (podman only).
IMAGE_ARGS ?=
image:
	docker/build-local.sh $(IMAGE_ARGS)
image-check:
	docker/build-local.sh --check --shared $(SHARED) $(IMAGE_ARGS)

clean:
	rm -rf demo-out example-out .pytest_cache
