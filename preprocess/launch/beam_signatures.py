"""Beam's look-up of a function's parameters, remembered per function: stage 1's fixed cost, cut.

Beam reads the parameters of every method of every DoFn with `inspect.signature`, each time it builds a
pipeline's graph and each time a worker builds a stage: about 200 reads per DoFn, 30,000 per worker in a
stage-1 job, the same functions again and again. The answer depends on the function alone, so it is kept per
function (weakly: a lambda of a pipeline built and dropped takes its entry with it). Design notes:
docs/internals.md, "preprocess/launch/beam_signatures.py".
"""

import types
import weakref

from apache_beam.transforms import core

_BEAMS_OWN = core.get_function_args_defaults
# function -> (argument names, default values); a bound method's entry is under its function (the instance
# does not change its parameters, only drops the first).
_FUNCTIONS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_METHODS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _table_and_key(function):
    if type(function) is types.FunctionType:
        return _FUNCTIONS, function
    if type(function) is types.MethodType and type(function.__func__) is types.FunctionType:
        return _METHODS, function.__func__
    return None, None  # a builtin, a partial, a callable object: asked of Beam each time


def remembered_function_args_defaults(function):
    """Beam's `get_function_args_defaults(function)`, asked once per plain or bound function: fresh lists each
    call, as Beam's are."""
    table, key = _table_and_key(function)
    if table is None:
        return _BEAMS_OWN(function)
    found = table.get(key)
    if found is None:
        args, defaults = _BEAMS_OWN(function)
        found = table[key] = (tuple(args), tuple(defaults))
    return list(found[0]), list(found[1])


def remember_signatures() -> None:
    """Make Beam's DoFn introspection in this process go through `remembered_function_args_defaults`
    (idempotent). Beam calls it through its module's global, so the one assignment covers every caller."""
    core.get_function_args_defaults = remembered_function_args_defaults
