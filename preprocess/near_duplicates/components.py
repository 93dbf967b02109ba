"""Connected components of the verified pairs, one shuffle per round of label propagation.

Propagation, hooking and pointer jumping, and the rounds measured: docs/internals.md,
"preprocess/near_duplicates/components.py".
"""

import typing

import apache_beam as beam

# The steps with a 'stats' output declare their main output: Beam would infer a union with TaggedOutput.

# What is sent to an image's key in a round.
_STATE = 0  # (label, neighbours' keys): the image's own state
_LABEL = 1  # a label proposed to the image
_CHILD = 2  # the key of an image whose label is this image's key
_ENTRY = 3  # the representative's entry (last step only)
_ALONG = 4  # a value that needs the image's entry (last step only)


def _messages(node, label, old_label, neighbours, send_to_neighbours):
    """The messages an image sends after a round, except its answers to its children."""
    yield node, (_STATE, (label, neighbours))
    if send_to_neighbours:  # labels only fall: a neighbour already holds one at most as small as before
        for neighbour in neighbours:
            yield neighbour, (_LABEL, label)
    if old_label is not None and label < old_label and old_label != node:
        yield old_label, (_LABEL, label)  # hooking
    if label != node:
        yield label, (_CHILD, node)  # pointer jumping: answered next round


def _first_state(element):
    """(key, its neighbours' keys) -> the image's first messages; ("verified_pairs", n) on 'stats'."""
    node, neighbours = element
    neighbours = tuple(sorted(set(neighbours)))
    # Each distinct pair counted once, at its smaller key.
    yield beam.pvalue.TaggedOutput("stats", ("verified_pairs", sum(1 for key in neighbours if key > node)))
    yield from _messages(node, min(node, neighbours[0]), None, neighbours, True)


def _state_and_smallest(messages):
    state, smallest = None, None
    for kind, value in messages:
        if kind == _STATE:
            state = value
        elif kind == _LABEL and (smallest is None or value < smallest):
            smallest = value
    return state, smallest


def _label_round(element):
    """(key, messages) -> the messages of the next round. The messages are read twice, never held."""
    node, messages = element
    (old_label, neighbours), smallest = _state_and_smallest(messages)
    label = old_label if smallest is None else min(old_label, smallest)
    yield from _messages(node, label, old_label, neighbours, label < old_label)
    for kind, value in messages:
        if kind == _CHILD:
            yield value, (_LABEL, label)


def _labelled_entry(element):
    """(key, messages and the representative's entry) -> (label, entry): the entry under its component's
    label, or under its own key when it has no verified pair (only if it has flood followers: otherwise it
    is in no group); ("images_not_converged", 1) on 'stats' for an image that would still change label;
    (value, entry) on 'along' for each value sent along to the key."""
    node, messages = element
    state, smallest = _state_and_smallest(messages)
    entry = next((value for kind, value in messages if kind == _ENTRY), None)
    if state is not None:
        label = state[0]
        if smallest is not None and smallest < label:
            yield beam.pvalue.TaggedOutput("stats", ("images_not_converged", 1))
    else:
        label = node if entry is not None and entry[1].count > 1 else None
    if entry is None:
        return
    if label is not None:
        yield label, entry
    for kind, value in messages:
        if kind == _ALONG:
            yield beam.pvalue.TaggedOutput("along", (value, entry))


class LabelComponents(beam.PTransform):
    """Edges (key, key) and entries (key, (representative, Flood)) -> {"entries": (component label, entry),
    "stats": two PCollections of ("verified_pairs" | "images_not_converged", n), "along": (value, entry)},
    after `rounds` rounds
    (docs/internals.md). `along`: (key, value) pairs that need their key's entry (the near misses' members:
    the last step joins them to it, no shuffle of their own)."""

    def __init__(self, entries, rounds: int, along=None):
        super().__init__()
        self._entries = entries
        self._rounds = rounds
        self._along = along

    def expand(self, edges):
        first = (
            edges
            | "BothWays" >> beam.FlatMapTuple(lambda a, b: ((a, b), (b, a)))
            | "Neighbours" >> beam.GroupByKey()
            | "FirstLabels"
            >> beam.FlatMap(_first_state)
            .with_output_types(tuple[str, typing.Any])
            .with_outputs("stats", main="messages")
        )
        messages = first.messages
        for round_number in range(1, self._rounds + 1):
            messages = (
                messages
                | f"Round{round_number}" >> beam.GroupByKey()
                | f"Labels{round_number}" >> beam.FlatMap(_label_round)
            )
        last = [
            messages,
            self._entries | "TagEntries" >> beam.MapTuple(lambda key, entry: (key, (_ENTRY, entry))),
        ]
        if self._along is not None:
            last.append(self._along | "TagAlong" >> beam.MapTuple(lambda key, value: (key, (_ALONG, value))))
        labelled = (
            last
            | "MessagesAndEntries" >> beam.Flatten()
            | "LastRound" >> beam.GroupByKey()
            | "LabelledEntries"
            >> beam.FlatMap(_labelled_entry)
            .with_output_types(tuple[str, typing.Any])
            .with_outputs("stats", "along", main="entries")
        )
        # The two steps' stats unflattened: the caller's one Flatten takes them (a Flatten of its own
        # would be one more stage, each costing up to about 0.1 CPU s in worker processes).
        return {"entries": labelled.entries, "stats": (first.stats, labelled.stats), "along": labelled.along}
