"""Modes: small parts that change how :func:`~shapebucket.prewarm` makes its graphs (hooks in :mod:`.base`)."""
