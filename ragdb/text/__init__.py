"""Text in: the analyzer (normalization, tokenization, stemming, CJK unigrams and bigrams)
and its worker pool, chunking, titles and headings as fields, and snippets of hit text."""
