"""--max-failed-fraction checked while the images are decoded, not only once they all are."""

import collections
import math

import apache_beam as beam

from preprocess.errors import TooManyFailuresError

FOUND = "found"
UNIQUE = "unique"
FAILED = "failed"
_DELTA = 1e-9
_FIRST_SAMPLED_CHECK = 256


class KnownOutcomesFn(beam.CombineFn):
    """(kind, reason) items -> {"found": n, "unique": n, "failed": {reason: n}}: what is settled before decoding."""

    def create_accumulator(self):
        return collections.Counter()

    def add_input(self, accumulator, item):
        accumulator[tuple(item)] += 1
        return accumulator

    def merge_accumulators(self, accumulators):
        return sum(accumulators, collections.Counter())

    def extract_output(self, accumulator):
        failed = {reason: count for (kind, reason), count in accumulator.items() if kind == FAILED}
        return {FOUND: accumulator[(FOUND, None)], UNIQUE: accumulator[(UNIQUE, None)], FAILED: failed}


class FailureBudget:
    """One decoding DoFn instance's attempts and failures, committed per bundle (see the module doc)."""

    def __init__(self, max_failed_fraction: float | None):
        self._max = max_failed_fraction
        self._committed = (0, collections.Counter())
        self._attempts = 0
        self._failures: collections.Counter = collections.Counter()
        self._next_sampled_check = _FIRST_SAMPLED_CHECK

    def start_bundle(self):
        self._attempts, self._failures = self._committed[0], collections.Counter(self._committed[1])

    def finish_bundle(self):
        self._committed = (self._attempts, collections.Counter(self._failures))

    def record(self, reason: str | None, known: dict | None):
        """One decode attempt (`reason`: its failure, None for success); raises TooManyFailuresError."""
        self._attempts += 1
        if reason is not None:
            self._failures[reason] += 1
        if known is None or self._max is None or self._max >= 1 or not known[FOUND]:
            return
        allowed = self._max * known[FOUND]
        before = sum(known[FAILED].values())
        own = sum(self._failures.values())
        if before + own > allowed:
            self._fail(known, before + own, "certain")
        elif self._attempts >= self._next_sampled_check:
            self._next_sampled_check *= 2
            margin = math.sqrt(math.log(1 / _DELTA) / (2 * self._attempts))
            rate_at_least = max(0.0, own / self._attempts - margin)
            at_least = before + rate_at_least * known[UNIQUE]
            if at_least > allowed:
                self._fail(known, math.floor(at_least), f"estimated with 1 - {_DELTA:g} confidence")

    def _fail(self, known: dict, at_least: int, how: str):
        found = known[FOUND]
        before = ", ".join(f"{reason} {count}" for reason, count in sorted(known[FAILED].items())) or "none"
        own = ", ".join(f"{reason} {count}" for reason, count in sorted(self._failures.items()))
        raise TooManyFailuresError(
            f"stopped early: at least {at_least} of the {found} inputs found fail ({how}), more than "
            f"--max-failed-fraction {self._max:g} allows ({self._max * found:.0f}). Failed before decoding: "
            f"{before}. This worker decoded {self._attempts} of the {known[UNIQUE]} unique inputs and "
            f"{sum(self._failures.values())} failed: {own}. Nothing was published (the published "
            "dataset is unchanged). Fix the inputs (read access, the manifest's URIs), or re-run with a higher "
            "--max-failed-fraction if that many failures are expected."
        )


def known_outcomes(listed_records, listed_errors, unique, errors_before_decoding):
    """The side input of FailureBudget: a singleton PCollection of KnownOutcomesFn's dict."""
    return (
        (
            listed_records | "KnownFound" >> beam.Map(lambda _: (FOUND, None)),
            listed_errors | "KnownFoundFailed" >> beam.Map(lambda _: (FOUND, None)),
            unique | "KnownUnique" >> beam.Map(lambda _: (UNIQUE, None)),
            errors_before_decoding | "KnownFailed" >> beam.Map(lambda error: (FAILED, error.reason)),
        )
        | "KnownItems" >> beam.Flatten()
        | "KnownOutcomes" >> beam.CombineGlobally(KnownOutcomesFn())
    )
