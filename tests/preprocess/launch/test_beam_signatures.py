"""Beam's parameter look-ups remembered per function (preprocess/launch/beam_signatures.py): the same answers
as Beam's own, fresh lists each time, nothing kept alive, and in force wherever stage 1 builds a graph."""

import functools
import gc
import weakref

import apache_beam as beam
from apache_beam.transforms import core, userstate

from preprocess.launch import beam_signatures

_BEAMS_OWN = beam_signatures._BEAMS_OWN


class _StatefulFn(beam.DoFn):
    COUNT = userstate.CombiningValueStateSpec("count", combine_fn=sum)

    def process(self, element, count=beam.DoFn.StateParam(COUNT), window=beam.DoFn.WindowParam):  # noqa: B008 - Beam's way
        yield element

    @classmethod
    def make(cls, first, second=2):
        return cls()


class _Callable:
    def __call__(self, element, side=None):
        return element


def _plain(element, side_input, scale=3):
    return element


def _callables():
    return [
        _plain,
        lambda element, *args, **kwargs: element,
        _StatefulFn().process,
        _StatefulFn.process,
        _StatefulFn.make,
        _Callable(),
        functools.partial(_plain, side_input=1),
        len,
        str.strip,
    ]


def test_the_same_answers_as_beams_own_every_time():
    for function in _callables():
        expected = _BEAMS_OWN(function)
        for _ in range(3):
            assert beam_signatures.remembered_function_args_defaults(function) == expected, function


def test_each_call_gets_lists_of_its_own():
    first_args, first_defaults = beam_signatures.remembered_function_args_defaults(_plain)
    first_args.append("changed")
    first_defaults.clear()
    assert beam_signatures.remembered_function_args_defaults(_plain) == _BEAMS_OWN(_plain)


def test_a_bound_method_is_asked_once_per_function_whatever_the_instance(monkeypatch):
    asked = []

    def counting(function):
        asked.append(function)
        return _BEAMS_OWN(function)

    monkeypatch.setattr(beam_signatures, "_BEAMS_OWN", counting)
    monkeypatch.setattr(beam_signatures, "_METHODS", weakref.WeakKeyDictionary())
    for _ in range(5):
        beam_signatures.remembered_function_args_defaults(_StatefulFn().process)
    assert len(asked) == 1


def test_a_dropped_function_takes_its_entry_with_it():
    function = eval("lambda element, extra=1: element")  # noqa: S307 - a function no module keeps
    beam_signatures.remembered_function_args_defaults(function)
    alive = weakref.ref(function)
    del function
    gc.collect()
    assert alive() is None


def test_state_and_timers_are_still_found(monkeypatch):
    # Beam tells a stateful DoFn by the defaults of its methods: through the remembered look-up too.
    monkeypatch.setattr(core, "get_function_args_defaults", beam_signatures.remembered_function_args_defaults)
    for _ in range(2):
        assert userstate.is_stateful_dofn(_StatefulFn())
        state_specs, _ = userstate.get_dofn_specs(_StatefulFn())
        assert [spec.name for spec in state_specs] == ["count"]
    assert not userstate.is_stateful_dofn(core.CallableWrapperDoFn(_plain))


def test_in_force_once_stage_1_builds_a_graph():
    import preprocess.pipeline  # noqa: F401, PLC0415 - what every stage-1 run imports

    assert core.get_function_args_defaults is beam_signatures.remembered_function_args_defaults
