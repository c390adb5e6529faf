"""Modes: small parts that change how :func:`~shapebucket.prewarm` makes its graphs (hooks in :mod:`.base`).

:mod:`shapebucket.compile` exports the modes; import the modules themselves
(:mod:`.base`, :mod:`.cached`, :mod:`.run`, :mod:`.specialize`) for the rest.
"""
