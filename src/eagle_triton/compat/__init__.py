"""Old home of the SGLang compatibility layer; :mod:`eagle_triton.compat.sglang` is an alias of
:mod:`eagle_triton.integrations.sglang`."""
