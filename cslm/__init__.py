"""The CSLM (SPEC §5): model, scoring, model files, training, NPLM export and the n-best feature."""
