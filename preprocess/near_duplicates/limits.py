"""The near-duplicate audit's guards on its outcome, declared once (options.py and grouping.py read them;
no Beam import, so `--help` stays fast)."""

# A group of more near-duplicates than this is more likely a family of similar images than copies of one:
# listed, and none of its images is moved or dropped (--near-duplicate-max-group).
DEFAULT_MAX_GROUP_SIZE = 50
# When the audit would move more than this share of the corpus's images to another split, it moves and
# drops none (--near-duplicate-max-moved): a share that large says the groups are wrong (similar images,
# not copies), and the requested split fractions would be lost.
DEFAULT_MAX_MOVED_SHARE = 0.05
