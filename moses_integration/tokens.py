"""Moses' tokenisation of phrases and sentences: the one place the project splits text into words.

Moses splits phrase-table phrases, corpus lines and decoder input on ASCII space and tab only
(``Tokenize(str, " \\t")`` and ``Phrase::CreateFromString``). A no-break space (U+00A0, U+202F,
frequent in French typography) is therefore *part of* a token, and ``str.split()`` would be wrong:
it also splits on those. Every caller (vocabulary, training data, scoring, the word penalty, the
CSLM) must use this module so that the network sees exactly the words Moses looks up.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: The characters Moses separates tokens with.
TOKEN_SEPARATORS = " \t"
#: A regular expression for one run of separators (also usable with pyarrow's ``split_pattern_regex``).
SEPARATOR_PATTERN = "[ \t]+"
_SEPARATOR_RUN = re.compile(SEPARATOR_PATTERN)


def split_tokens(text: str) -> list[str]:
    """The tokens of ``text`` as Moses sees them: split on runs of ASCII space/tab, empties dropped."""
    return [token for token in _SEPARATOR_RUN.split(text) if token]


def split_tokens_arrow(texts: pa.Array | pa.ChunkedArray) -> pa.ListArray:
    """:func:`split_tokens` for a whole Arrow string array at once (phrase-table chunks).

    ``pc.utf8_split_whitespace`` would split on Unicode spaces too, so the split is on
    :data:`SEPARATOR_PATTERN` and the empty strings that leading, trailing or repeated separators
    leave are dropped, exactly as :func:`split_tokens` does.
    """
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    parts = pc.split_pattern_regex(texts, SEPARATOR_PATTERN)
    offsets = parts.offsets.to_numpy().astype(np.int64)
    flat = parts.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    keep = pc.greater(pc.binary_length(flat), 0).to_numpy(zero_copy_only=False)
    kept_before = np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])
    new_offsets = kept_before[offsets - offsets[0]]
    return pa.ListArray.from_arrays(pa.array(new_offsets.astype(np.int32)), pc.filter(flat, pa.array(keep)))
