"""Commands around training: the input benchmark, the supervisor, the slice's TPU server wait."""
