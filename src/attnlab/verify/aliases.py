"""The write-ups' former names, kept so that scripts written against them still work.

The four write-ups were once numbered 000 to 003; `attnlab verify` still accepts those names in place of a
write-up's key (``attnlab verify seed000`` is ``attnlab verify magnitude``). This table is the one place the old
names appear in the package (tests/test_words.py allows them here only).
"""

LEGACY_NAMES = {
    "seed000": "magnitude",
    "seed001": "boneless",
    "seed002": "masking",
    "seed003": "softmax",
}
