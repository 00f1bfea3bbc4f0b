"""The analysis commands: ``compare``, ``sample``, the plots and ``report``."""

#: What ``rescorer report`` writes into OUT_DIR, the page and its figures: refused where one is an input,
#: and replaced together (:func:`infrastructure.files.files_replaced_together`).
REPORT_FILES = ("report.html", "scores.png", "training.png", "words.png", "phrases.png")
