# make install / test / lint / demo / bench / tune. Every target sets up .venv itself.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint demo bench tune clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check .

# The main job on the built-in sample: train a small model on the sample table's own
# unique pairs within a short budget, then append the two RNN columns.
demo: install
	mkdir -p demo-out
	$(BIN)/rescore-phrase-table examples/phrase-table.en-fr.gz demo-out/phrase-table.rnn.gz \
		--moses-ini examples/moses.ini --moses-ini-out demo-out/moses.ini \
		--train-steps 300 --hidden 64 --embedding 32 --maxout-units 32 --output-rank 32
	@echo "--- first lines of demo-out/phrase-table.rnn.gz:"
	@$(BIN)/python -c "import gzip,itertools,sys; sys.stdout.writelines(l.decode() for l in itertools.islice(gzip.open('demo-out/phrase-table.rnn.gz'),5))"

bench: install
	$(BIN)/python benchmarks/train_speed.py
	$(BIN)/python benchmarks/score_speed.py
	$(BIN)/python benchmarks/mert_speed.py

clean:
	rm -rf demo-out .pytest_cache
