"""Moses' tokenisation of phrases and sentences: the one place the project splits text into words.

Moses splits phrase-table phrases, corpus lines and decoder input on ASCII space and tab only
(``Tokenize(str, " \\t")`` and ``Phrase::CreateFromString``). A no-break space (U+00A0, U+202F,
frequent in French typography) is therefore *part of* a token, and ``str.split()`` would be wrong:
it also splits on those. Every caller (vocabulary, training data, scoring, the word penalty, the
CSLM) must use this module so that the network sees exactly the words Moses looks up.
"""

from __future__ import annotations

import re

#: The characters Moses separates tokens with.
TOKEN_SEPARATORS = " \t"
#: A regular expression for one run of separators (also usable with pyarrow's ``split_pattern_regex``).
SEPARATOR_PATTERN = "[ \t]+"
_SEPARATOR_RUN = re.compile(SEPARATOR_PATTERN)


def split_tokens(text: str) -> list[str]:
    """The tokens of ``text`` as Moses sees them: split on runs of ASCII space/tab, empties dropped."""
    return [token for token in _SEPARATOR_RUN.split(text) if token]
