"""The score columns ``rescore-phrase-table`` appends to each line."""
