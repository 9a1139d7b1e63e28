"""The data layer: corpora (the embedded Shakespeare plays or user text), tokenisers, cached token arrays, batches.

Typical use::

    ds = prepare(DataConfig())                      # or DataConfig(source="my_texts/", tokenizer="bpe")
    x, y = ds.get_batch("train", 32, 256, generator)
"""

from .corpus import (
    Document,
    clean_play,
    corpus_documents,
    join_documents,
    load_documents,
    load_text,
    shakespeare_documents,
    shakespeare_text,
    split_documents,
)
from .dataset import DataConfig, Dataset, default_cache_dir, prepare, token_dtype
from .tokenizers import BPETokenizer, CharTokenizer, load_tokenizer

__all__ = [
    "BPETokenizer",
    "CharTokenizer",
    "DataConfig",
    "Dataset",
    "Document",
    "clean_play",
    "corpus_documents",
    "default_cache_dir",
    "join_documents",
    "load_documents",
    "load_text",
    "load_tokenizer",
    "prepare",
    "shakespeare_documents",
    "shakespeare_text",
    "split_documents",
    "token_dtype",
]
